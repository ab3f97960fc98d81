// Command reaperd is the reaper host: it reads an HCL configuration, starts
// the substrate and reaper plugins, and (on the leader) runs the
// reconcile-then-reap cycle.
//
//	reaperd run -config FILE        run the daemon
//	reaperd validate -config FILE   parse, check the ladder, start and configure every plugin
//	reaperd migrate -config FILE    apply the board's schema migrations
//	reaperd version                 print the version and the plugin protocol version
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/daemon"
	"github.com/dexaflow/reaper/internal/confine"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/plugin"
)

const usage = `usage: reaperd <command> [flags]

commands:
  run -config FILE        run the daemon: leadership, the settling gate, and
                          the reconcile-then-reap cycle on the leader
  migrate -config FILE    apply the board's schema migrations (idempotent)
  validate -config FILE   check a configuration: syntax, keys, timing ladder,
                          and every plugin's own block (the plugins are started);
                          reports every problem, writes nothing
  version                 print the version
`

func main() {
	// Before anything else: reaperd's environment (REAPER_DSN) and memory
	// (the DSN, the signing key, the database connections) must not be
	// readable by its plugins, which run as its user. Non-dumpable, its
	// /proc/<pid>/environ and mem are closed to every process of that user
	// without CAP_SYS_PTRACE.
	if err := confine.Undumpable(); err != nil {
		fmt.Fprintf(os.Stderr, "reaperd: %v\n", err)
		os.Exit(1)
	}
	// The host serves every pass its board and audits its decisions: it
	// runs under the reap passes' GC target (plugin.GCPercent).
	plugin.TuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "version", "-version", "--version":
		fmt.Fprintf(stdout, "reaperd %s (plugin protocol %d)\n", sdk.BuildVersion, plugin.ProtocolVersion)
		return 0
	case "validate":
		return cmdValidate(ctx, args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stderr)
	case "migrate":
		return cmdMigrate(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "reaperd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// newLogger returns the host's logger: JSON lines unless w is a terminal.
func newLogger(w io.Writer, level hclog.Level) hclog.Logger {
	json := true
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			json = false
		}
	}
	return hclog.New(&hclog.LoggerOptions{Name: "reaperd", Output: w, Level: level, JSONFormat: json})
}

func parseConfigFlag(name string, args []string, stderr io.Writer) (string, bool) {
	fs := flag.NewFlagSet("reaperd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to the HCL configuration file")
	if err := fs.Parse(args); err != nil {
		return "", false
	}
	if *path == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "usage: reaperd %s -config FILE\n", name)
		return "", false
	}
	return *path, true
}

// loadConfig reads the file and reports its problems the way every command
// does: each diagnostic on its own line, warnings logged.
func loadConfig(path string, logger hclog.Logger, stderr io.Writer) (*config.Config, bool) {
	return loadConfigWith(path, config.Options{}, logger, stderr)
}

// loadConfigWith is loadConfig with options of the command's own.
func loadConfigWith(path string, opts config.Options, logger hclog.Logger, stderr io.Writer) (*config.Config, bool) {
	cfg, err := config.Load(path, opts)
	forgetDSN()
	if err != nil {
		var cerr *config.Error
		if errors.As(err, &cerr) {
			fmt.Fprintf(stderr, "%s\n", cerr.Error())
		} else {
			fmt.Fprintf(stderr, "reaperd: %v\n", err)
		}
		return nil, false
	}
	for _, w := range cfg.Warnings {
		logger.Warn(w)
	}
	return cfg, true
}

// forgetDSN removes REAPER_DSN from reaperd's environment once the
// configuration has read it: no process reaperd starts (a plugin, a Lite
// agent, their children) inherits it, whatever the launching code passes
// on. What the kernel shows as /proc/<pid>/environ (the environment
// reaperd was started with) is closed by Undumpable.
func forgetDSN() {
	_ = os.Unsetenv(config.EnvDSN)
}

// commandSetup is what every command that takes -config does first: parse
// the flag, make the logger, load the file. A non-zero code is the exit
// status to return at once (2: usage, 1: a bad file).
func commandSetup(name string, args []string, stderr io.Writer, level hclog.Level) (string, *config.Config, hclog.Logger, int) {
	path, ok := parseConfigFlag(name, args, stderr)
	if !ok {
		return "", nil, nil, 2
	}
	logger := newLogger(stderr, level)
	cfg, ok := loadConfig(path, logger, stderr)
	if !ok {
		return "", nil, nil, 1
	}
	return path, cfg, logger, 0
}

// cmdValidate checks a file as far as it can and reports every problem it
// finds, in the order of the file: the host's own keys and the timing
// ladder, then each plugin's block, checked by the plugin itself (each is
// started, configured and stopped). It writes nothing and connects to no
// database.
func cmdValidate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	path, ok := parseConfigFlag("validate", args, stderr)
	if !ok {
		return 2
	}
	logger := newLogger(stderr, hclog.Warn)
	cfg, diags, err := config.CheckFile(path, config.Options{})
	forgetDSN()
	if err != nil {
		fmt.Fprintf(stderr, "reaperd: %v\n", err)
		return 1
	}
	if cfg != nil && (cfg.Edition == ladder.EditionLite || cfg.Edition == ladder.EditionKube) {
		diags = append(diags, daemon.Check(ctx, cfg, daemon.Options{Logger: logger})...)
	}
	if diags.HasErrors() {
		sortByPosition(diags)
		fmt.Fprintln(stderr, config.FormatDiagnostics(diags))
		return 1
	}
	for _, w := range cfg.Warnings {
		logger.Warn(w)
	}
	fmt.Fprintf(stdout, "%s: valid (edition %s, substrate %s, reapers %v)\n",
		path, cfg.Edition, cfg.Substrate.Name, cfg.ReaperNames())
	return 0
}

// sortByPosition orders diagnostics as an operator reads the file: top to
// bottom, those about no position first.
func sortByPosition(diags hcl.Diagnostics) {
	pos := func(d *hcl.Diagnostic) (int, int) {
		if d.Subject == nil {
			return 0, 0
		}
		return d.Subject.Start.Line, d.Subject.Start.Column
	}
	slices.SortStableFunc(diags, func(a, b *hcl.Diagnostic) int {
		al, ac := pos(a)
		bl, bc := pos(b)
		return cmp.Or(cmp.Compare(al, bl), cmp.Compare(ac, bc))
	})
}
