package main

import (
	"context"
	"io"

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
		logger.Error("reaperd could not start", "error", err)
		return 1
	}
	defer d.Close()
	if err := d.Run(ctx); err != nil {
		logger.Error("reaperd stopped", "error", err)
		return 1
	}
	return 0
}
