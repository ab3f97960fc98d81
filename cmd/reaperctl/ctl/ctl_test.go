package ctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestHelp(t *testing.T) {
	t.Parallel()
	cli := CLI{}

	t.Run("HelpListsEveryCommand", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
			r := run(t, cli, args...).ok(t)
			if r.stdout != Usage() {
				t.Fatalf("%v printed:\n%s", args, r.stdout)
			}
		}
		for _, cmd := range commands() {
			if !strings.Contains(Usage(), "  reaperctl "+cmd.name+" ") {
				t.Errorf("usage lacks %s", cmd.name)
			}
		}
	})

	t.Run("EveryCommandHasItsUsage", func(t *testing.T) {
		t.Parallel()
		for _, cmd := range commands() {
			want := run(t, cli, cmd.name, "-h").ok(t).stdout
			for _, args := range [][]string{{cmd.name, "--help"}, {"help", cmd.name}, {cmd.name, "-config", "x", "-h", "r"}} {
				if got := run(t, cli, args...).ok(t).stdout; got != want {
					t.Fatalf("%v printed:\n%s\nwant:\n%s", args, got, want)
				}
			}
			for _, part := range append(cmd.synopsis, "usage: reaperctl "+cmd.name, cmd.help, "-config FILE", "-json") {
				if !strings.Contains(want, part) {
					t.Fatalf("usage of %s lacks %q:\n%s", cmd.name, part, want)
				}
			}
		}
	})

	t.Run("HelpOfAnUnknownCommand", func(t *testing.T) {
		t.Parallel()
		run(t, cli, "help", "reap").failed(t, 2, `unknown command "reap"`)
	})
}

func TestBadCommandLine(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	b.createRun(t, "r", base.Add(-time.Hour), "t")
	before := b.snapshot(t)

	cases := []struct {
		name string
		args []string // after the command's -config FILE, unless noConfig
		cmd  string
		want string
	}{
		{"NoCommand", nil, "", "no command"},
		{"UnknownCommand", nil, "reap", `unknown command "reap"`},
		{"UnknownFlag", []string{"-x"}, "status", "flag provided but not defined: -x"},
		{"BadFlagValue", []string{"-limit", "many"}, "status", `invalid value "many" for flag -limit`},
		{"FlagWithoutValue", []string{"-limit"}, "status", "flag needs an argument: -limit"},
		{"StatusTwoRuns", []string{"r", "s"}, "status", `unexpected argument "s"`},
		{"StatusUnknownState", []string{"-state", "lost"}, "status", `-state "lost": not a run state`},
		{"StatusLimitZero", []string{"-limit", "0"}, "status", "-limit 0"},
		{"StatusFilterWithRun", []string{"-state", "running", "r"}, "status", "do not apply to one RUN"},
		{"ExplainOneArgument", []string{"r"}, "explain", "missing arguments: reaperctl explain [-limit N] RUN TASK"},
		{"ExplainThreeArguments", []string{"r", "t", "u"}, "explain", `unexpected argument "u"`},
		{"ExplainNegativeLimit", []string{"-limit", "-1", "r", "t"}, "explain", "-limit -1"},
		{"ReleaseNoArguments", nil, "release", "missing arguments"},
		{"HeldArgument", []string{"r"}, "held", `unexpected argument "r"`},
		{"TuneNegativeWindow", []string{"-window", "-1h"}, "tune", "-window -1h0m0s"},
		{"TuneBadDuration", []string{"-window", "week"}, "tune", `invalid value "week" for flag -window`},
		{"TuneMinSamplesZero", []string{"-min-samples", "0"}, "tune", "-min-samples 0"},
		{"SubmitNoCommand", nil, "submit", "no command"},
		{"SubmitBoth", []string{"-n", "2", "-command", "true", "--", "false"}, "submit", "not both"},
		{"SubmitNWithoutCommand", []string{"-n", "2"}, "submit", "-n and -command go together"},
		{"SubmitNZero", []string{"-n", "0", "-command", "true"}, "submit", "-n 0"},
		{"SubmitEmptyCommand", []string{"--", "true", " "}, "submit", "command 2 is empty"},
		{"SubmitNegativeTimeout", []string{"-timeout", "-5s", "--", "true"}, "submit", "-timeout -5s"},
		{"SubmitNegativeRetries", []string{"-retries", "-1", "--", "true"}, "submit", "-retries -1"},
		{"SubmitTaskCountMismatch", []string{"-tasks", "a,b", "--", "true"}, "submit", "-tasks names 2 tasks for 1 commands"},
		{"SubmitRepeatedTask", []string{"-tasks", "a,a", "--", "true", "false"}, "submit", `-tasks names "a" twice`},
		{"SubmitRunIDWithSpace", []string{"-run", "my run", "--", "true"}, "submit", `-run "my run"`},
		{"SubmitEmptyTaskID", []string{"-tasks", "a,", "--", "true", "false"}, "submit", "-tasks: an empty id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			if c.cmd != "" {
				args = append([]string{c.cmd, "-config", b.cfgPath}, c.args...)
			}
			run(t, b.cli, args...).failed(t, 2, c.want)
		})
	}

	t.Run("MissingConfig", func(t *testing.T) {
		for _, cmd := range []string{"submit", "status", "explain", "tune", "held", "release"} {
			args := map[string][]string{"submit": {"--", "true"}, "explain": {"r", "t"}, "release": {"r", "t"}}[cmd]
			run(t, b.cli, append([]string{cmd}, args...)...).failed(t, 2, "-config FILE is required")
		}
	})

	b.unchanged(t, before)
}

// every command line that reaches the board, with arguments that would
// succeed on a board holding run r with task t.
var reachingCommands = [][]string{
	{"submit", "--", "true"},
	{"status"},
	{"status", "r"},
	{"explain", "r", "t"},
	{"tune"},
	{"held"},
	{"release", "r", "t"},
}

func TestBoardProblems(t *testing.T) {
	t.Parallel()
	cli := CLI{Now: func() time.Time { return base }, Getenv: func(string) string { return "" }}

	t.Run("UnreachableDatabase", func(t *testing.T) {
		t.Parallel()
		cfg := writeConfig(t, closedDSN(t), "")
		for _, args := range reachingCommands {
			for _, json := range []bool{false, true} {
				line := append([]string{args[0], "-config", cfg}, args[1:]...)
				if json {
					line = append([]string{args[0], "-json", "-config", cfg}, args[1:]...)
				}
				start := time.Now()
				run(t, cli, line...).failed(t, 1, "reaperctl "+args[0]+": cannot reach the board: ")
				if d := time.Since(start); d > 10*time.Second {
					t.Fatalf("%v took %v to give up", line, d)
				}
			}
		}
	})

	t.Run("MissingConfigurationFile", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "nope.hcl")
		run(t, cli, "status", "-config", missing).failed(t, 1, "read configuration")
	})

	t.Run("InvalidConfigurationIsOneLine", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "bad.hcl")
		src := "edition = \"lite\"\ncolour = \"red\"\nsubstrate \"lite\" {}\nladder {\n  agent_lost = \"5s\"\n}\n"
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, cli, "tune", "-config", path)
		r.failed(t, 1, "configuration: ")
		if !strings.Contains(r.stderr, "bad.hcl:2:") {
			t.Fatalf("no file:line in %q", r.stderr)
		}
	})

	t.Run("NoDSN", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nodsn.hcl")
		if err := os.WriteFile(path, []byte("edition = \"lite\"\nsubstrate \"lite\" {}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		run(t, cli, "held", "-config", path).failed(t, 1, "no database: set store.dsn")
	})

	t.Run("UnmigratedDatabase", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.NewEmptyDB(t)
		cfg := writeConfig(t, pgtest.DSN(pool), "")
		for _, args := range reachingCommands {
			line := append([]string{args[0], "-config", cfg}, args[1:]...)
			run(t, cli, line...).failed(t, 1, "reaperd migrate -config")
		}
		// Nothing was created either: the database still has no tables.
		var n int
		if err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d tables, %v", n, err)
		}
	})
}
