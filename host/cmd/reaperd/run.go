package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/daemon"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	_, cfg, logger, code := commandSetup("run", args, stderr, hclog.Info)
	if code != 0 {
		return code
	}
	d, err := daemon.New(ctx, cfg, daemon.Options{Logger: logger})
	if err != nil {
		// One plain line, as validate gives: the operator reads it, not a
		// log pipeline.
		fmt.Fprintf(stderr, "reaperd: cannot start: %s\n", oneLine(err))
		return 1
	}
	defer d.Close()
	if err := d.Run(ctx); err != nil {
		logger.Error("reaperd stopped", "error", err)
		fmt.Fprintf(stderr, "reaperd: stopped: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// oneLine is err's text on a single line: a plugin's or a library's error
// may carry newlines (a plugin's own stderr, a wrapped multi-error).
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
