// Command reaperctl is the operator's command line over the board: submit
// Lite work, see runs and attempts, explain why an attempt was or was not
// reaped, tune thresholds from observed durations, and release attempts
// held for review. Run reaperctl help for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
