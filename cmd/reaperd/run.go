package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/daemon"
	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/sdk/clock"
)

// The DSN file's re-reads while reaperd waits for it: from dsnRetryMin,
// doubling up to dsnRetryMax. dsnWatchEvery is how often it is read while
// the database refuses the DSN in use.
const (
	dsnRetryMin   = 500 * time.Millisecond
	dsnRetryMax   = 10 * time.Second
	dsnWatchEvery = 2 * time.Second
)

// errDSNChanged stops a daemon whose database never admitted it (the DSN
// was wrong) once the DSN file holds another DSN: it starts again with it.
var errDSNChanged = errors.New("the DSN file changed")

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	path, ok := parseConfigFlag("run", args, stderr)
	if !ok {
		return 2
	}
	logger := newLogger(stderr, hclog.Info)
	// A DSN file that is missing or not one line is waited for below.
	cfg, ok := loadConfigWith(path, config.Options{WaitForDSNFile: true}, logger, stderr)
	if !ok {
		return 1
	}
	for {
		if cfg.StoreDSNFile != "" {
			dsn, err := waitForDSN(ctx, cfg, logger)
			if err != nil {
				if ctx.Err() != nil {
					return 0
				}
				fmt.Fprintf(stderr, "reaperd: cannot start: %s\n", oneLine(err))
				return 1
			}
			cfg.StoreDSN, cfg.StoreDSNWait = dsn, nil
		}
		d, err := daemon.New(ctx, cfg, daemon.Options{Logger: logger})
		if err != nil {
			// One plain line, as validate gives: the operator reads it, not a
			// log pipeline.
			fmt.Fprintf(stderr, "reaperd: cannot start: %s\n", oneLine(err))
			return 1
		}
		runCtx, stop := context.WithCancelCause(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			if cfg.StoreDSNFile != "" {
				watchDSN(runCtx, stop, d, cfg.StoreDSNFile, cfg.StoreDSN, logger)
			}
		}()
		err = d.Run(runCtx)
		changed := errors.Is(context.Cause(runCtx), errDSNChanged) && ctx.Err() == nil
		stop(nil)
		<-watched
		d.Close()
		if err != nil {
			logger.Error("reaperd stopped", "error", err)
			fmt.Fprintf(stderr, "reaperd: stopped: %s\n", oneLine(err))
			return 1
		}
		if !changed {
			return 0
		}
		logger.Info("the DSN file changed before the database admitted this replica: starting again with the new DSN")
	}
}

// waitForDSN returns the DSN of cfg's DSN file as soon as the file holds
// one that parses. Until then (the file is missing, empty, not one line,
// or not a connection string: a Secret not created, not mounted or
// written wrong, which can be put right without restarting the pod) it
// serves telemetry whose readiness answers 503 with the reason, logs the
// reason in one line whenever it changes, and reads the file again with
// backoff. A file refused for good (others may read it) is an error.
func waitForDSN(ctx context.Context, cfg *config.Config, logger hclog.Logger) (string, error) {
	path := cfg.StoreDSNFile
	read := func() (string, error) {
		dsn, err := config.ReadDSNFile(path)
		if err != nil {
			return "", err
		}
		return dsn, dsnParses(path, dsn)
	}
	dsn, err := read()
	if err == nil {
		return dsn, nil
	}
	var ferr *config.DSNFileError
	if !errors.As(err, &ferr) {
		return "", err
	}
	var reason atomic.Pointer[string]
	say := func(err error) {
		line := "reaperd is waiting for its DSN: " + err.Error()
		if old := reason.Swap(&line); old == nil || *old != line {
			logger.Error(line + "; readiness answers 503 until it is there")
		}
	}
	say(err)
	sctx, stopServing := context.WithCancel(ctx)
	_, served, serr := telemetry.Serve(sctx, cfg.Telemetry.Listen, cfg.Telemetry.Limits,
		telemetry.WaitingHandler(func() string { return *reason.Load() }), logger.Named("telemetry"), loopbackOf(cfg)...)
	if serr != nil {
		stopServing()
		return "", serr
	}
	defer func() {
		stopServing()
		if err := <-served; err != nil {
			logger.Warn("telemetry server", "error", err)
		}
	}()
	clk := clock.Real{}
	delay := dsnRetryMin
	for {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-clk.After(delay):
		}
		delay = min(2*delay, dsnRetryMax)
		dsn, err := read()
		switch {
		case err == nil:
			logger.Info("the DSN file holds a DSN: starting", "dsn_file", cfg.StoreDSNFile)
			return dsn, nil
		case errors.As(err, &ferr):
			say(err)
		default:
			return "", err
		}
	}
}

// dsnParses returns a *config.DSNFileError when the DSN read from path
// does not parse (it never carries the DSN's text).
func dsnParses(path, dsn string) error {
	if _, err := board.ParseDSN(dsn); err != nil {
		return &config.DSNFileError{Path: path, Problem: "does not hold a valid DSN: " + err.Error()}
	}
	return nil
}

// watchDSN stops the daemon d, with errDSNChanged, when the DSN file comes
// to hold another DSN that parses while d has not passed its schema gate
// (its database refused the DSN in use, or cannot be reached with it).
// Once d has started it watches no more: a DSN changed under a running
// replica (a password rotated) is taken at its next start.
func watchDSN(ctx context.Context, stop context.CancelCauseFunc, d *daemon.Daemon, path, inUse string, logger hclog.Logger) {
	tk := clock.Real{}.NewTicker(dsnWatchEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
		if d.Started() {
			return
		}
		dsn, err := config.ReadDSNFile(path)
		if err != nil || dsn == inUse || dsnParses(path, dsn) != nil {
			continue
		}
		logger.Info("the DSN file holds a new DSN while the database has not admitted this replica", "dsn_file", path)
		stop(errDSNChanged)
		return
	}
}

// loopbackOf is the telemetry's second address, if it has one.
func loopbackOf(cfg *config.Config) []string {
	if cfg.Telemetry.Loopback == "" {
		return nil
	}
	return []string{cfg.Telemetry.Loopback}
}

// oneLine is err's text on a single line: a plugin's or a library's error
// may carry newlines (a plugin's own stderr, a wrapped multi-error).
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
