// Package ctl is reaperctl, the operator's command line over the board. It
// reads the same configuration file as reaperd (the store's DSN, which
// REAPER_DSN overrides, and the timing ladder) and answers an operator's
// questions from the board: what runs and attempts are doing (status), why
// an attempt was or was not reaped (explain), whether the thresholds fit the
// durations actually observed (tune), what each threshold would have done
// to the attempts of the last week (replay), how the shadow decisions of
// dry-run and held reapers scored against what really happened (shadow),
// and what is held for review (held, release). It writes an operator's verdict on an attempt (mark) and
// submits Lite work (submit).
//
// Every command prints a table for people, or one JSON document with -json.
// A failure is one line on stderr and a non-zero exit: 2 for a malformed
// command line (nothing is read or written), 1 for anything else (the board
// unreachable, an unknown run or task, ...). A command that fails writes
// nothing to the board.
package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
)

// ConnectTimeoutDefault bounds connecting to the board when the DSN does
// not set connect_timeout.
const ConnectTimeoutDefault = 5 * time.Second

// CLI is reaperctl with its environment. The zero value reads the wall clock
// and the process environment.
type CLI struct {
	// Now is the clock that ages are measured by and writes are stamped
	// with; nil means time.Now.
	Now func() time.Time
	// Getenv looks up environment variables (REAPER_DSN); nil means os.Getenv.
	Getenv func(string) string

	// beforeWrite, when set, runs between a command's read of the board
	// and its write (tests: the attempt moving on in between).
	beforeWrite func()
}

// Run runs reaperctl with the wall clock and the process environment.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return CLI{}.Run(ctx, args, stdout, stderr)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// command is one subcommand of reaperctl.
type command struct {
	name     string
	synopsis []string // each form, after "reaperctl NAME"
	summary  string   // one line, for the command list
	help     string   // what it does, for NAME -h
	run      func(c CLI, ctx context.Context, inv *invocation) error
	// writes: the command writes the board (and names its operator, -by);
	// every other command only reads it, and works with a read-only role.
	writes bool
}

func commands() []command {
	return []command{
		{name: "submit", run: CLI.submit, writes: true,
			synopsis: []string{
				"[-by NAME] [-run ID] [-dag NAME] [-tasks ID,...] [-timeout D] [-retries N] [-sensor D] -- CMD [CMD ...]",
				"[-by NAME] [-run ID] [-dag NAME] [-timeout D] [-retries N] [-sensor D] -n N -command CMD",
				"[-by NAME] [-run ID] [-dag NAME] -file RUN.hcl",
			},
			summary: "create a running run of tasks, one per shell command or as a run file declares; print its id",
			help: "Creates a run (state running) of task instances, one per shell command (each CMD is\n" +
				"one command line: quote it), or N task instances running the same -command. Task ids are\n" +
				"t1..tN unless -tasks names them. With -file, the run file (HCL) declares the run: one\n" +
				"task block a task, with its command, upstream tasks, retries and timeouts; a task runs\n" +
				"once every upstream succeeded. A file whose upstreams name an unknown task, a task twice\n" +
				"or a cycle is refused, naming the task and its line. Prints the run id. The audit\n" +
				"(operator_submit) names the operator."},
		{name: "status", run: CLI.status,
			synopsis: []string{"[-v] [-state STATE] [-limit N] [RUN]"},
			summary:  "runs with their task counts; one run's attempts (every listed run's with -v)",
			help: "Lists runs, newest first: state, age, task instances by state, held attempts. With RUN,\n" +
				"or with -v, also lists attempts: task, state, try, epoch, time in state, last heartbeat,\n" +
				"failure, hold and error."},
		{name: "explain", run: CLI.explain,
			synopsis: []string{"[-limit N] RUN TASK"},
			summary:  "the reapers' decisions about a task instance, its row and its try log",
			help: "Tells the story of one task instance: its current row, then every reaper pass that\n" +
				"judged it (when, under which term, what it saw, what it decided, applied, deferred or\n" +
				"dry-run, and why), then its try log."},
		{name: "tune", run: CLI.tune,
			synopsis: []string{"[-window D] [-limit N] [-min-samples N]"},
			summary:  "observed durations and the thresholds they suggest; each rung's smallest threshold with no false reap",
			help: "Measures what the board has seen: how long successful attempts ran, how long they\n" +
				"waited queued, and how long successful runs sat with nothing live before they ended.\n" +
				"For each it prints the count, median, p99, p99.9 and max, and the threshold the\n" +
				"orphan-reaper pattern suggests: about 10 x the median and never under the observed\n" +
				"tail, max(10 x median, p99.9) rounded up. Then it compares the configured thresholds\n" +
				"that bound those times and flags each one below the observed tail (p99.9).\n\n" +
				"Last, the summary of reaperctl replay over the same window: for each rung, the false reaps\n" +
				"at the configured value, the largest value observed (and whose), and the smallest candidate\n" +
				"with no false reap with its margin over that value; none when every such candidate breaks\n" +
				"the timing ladder (said so), or nothing was observed."},
		{name: "replay", run: CLI.replay,
			synopsis: []string{"[-window D] [-rung RUNG [-candidates D,D,...]] [-list N] [-o table|json] [-picture FILE.svg]"},
			summary:  "each threshold replayed against the board's history: false reaps, lost recovered sooner or later",
			help: "Replays the thresholds the reapers judge by against what the board saw in the window: for\n" +
				"agent_lost the attempts' heartbeat silences, for dispatch_lost their waits from queued to\n" +
				"running, for pod_lost_floor how long kube attempts had run when a window in which the pod\n" +
				"cache held no pod of theirs ended while they lived on, for orphan_run the runs' longest quiet\n" +
				"periods, for the credential ceiling (auth.max_attempt_credential_lifetime) how long\n" +
				"successful attempts lived on their credentials. A value above a candidate that later proved\n" +
				"alive (it heartbeated again, reported, succeeded, started, its pod came back, or its run had\n" +
				"activity) is a false reap at that candidate,\n" +
				"and each is listed by run, task, try and epoch, the largest first, so a count can be checked\n" +
				"by hand (-list N of them; -o json lists them per candidate). For what really was lost\n" +
				"(marked agent_lost, dispatch_lost, pod_lost or credential_ceiling, a run failed orphan_run; for\n" +
				"agent_lost also an attempt marked pod_lost or warm_worker_lost while silent, which it\n" +
				"recovers only under a candidate below that silence), the shift is the candidate minus the\n" +
				"value at which it was settled: negative, recovered that much sooner.\n\n" +
				"The candidates are the configured value and multiples of it (1/4, 1/2, 3/4, 3/2, 2, 3 and 4,\n" +
				"rounded up to a round step), with the observed tail rounded up, less any that break the\n" +
				"timing ladder (each is named with the rule); or, with -rung, the ones -candidates gives,\n" +
				"and one that breaks the ladder is refused, naming the rung and the rule. Only the staleness\n" +
				"gate is replayed: a reaper's liveness read might still have deferred a false reap.\n" +
				"-picture writes an SVG of each rung's tail with the candidates drawn on it."},
		{name: "shadow", run: CLI.shadow,
			synopsis: []string{"[-window D] [-reaper NAME] [-v] [-o table|json]"},
			summary:  "shadow decisions scored by what became of their attempts: precision and recall per reaper",
			help: "Summarises, per reaper and decision label, the decisions of the window (default 7 days)\n" +
				"that failed or would have failed an attempt and are scored: dry-run ones, policy = \"hold\"\n" +
				"ones and provisional kube marks. Counts decisions (and attempts) by verdict:\n" +
				"would_have_killed_live_work (the attempt heartbeated, reported or succeeded after it),\n" +
				"right (it never came back and was settled lost, or its run failed), unresolved (no truth\n" +
				"within the horizon) and unscored (waiting for one). Precision is right / (right +\n" +
				"would_have_killed_live_work); a reaper's recall is its right attempts / (those + the\n" +
				"attempts another reaper's standing mark settled lost that it never flagged). -v names\n" +
				"the attempts and decision ids behind every number."},
		{name: "held", run: CLI.held,
			synopsis: []string{"[-limit N]"},
			summary:  "attempts held for review",
			help:     "Lists the attempts held for an operator's review, the oldest hold first."},
		{name: "release", run: CLI.release, writes: true,
			synopsis: []string{"[-by NAME] RUN TASK"},
			summary:  "release a held attempt, so the runner may re-place it",
			help: "Lifts the hold of the task instance's current attempt. Fails when it is not held. The try\n" +
				"log and the audit (operator_release) name the operator."},
		{name: "mark", run: CLI.mark, writes: true,
			synopsis: []string{"[-by NAME] RUN TASK failed|success"},
			summary:  "the operator's verdict on a task instance's current attempt: failed or success",
			help: "Marks the task instance's current attempt failed or success, as read now: it ends, with no\n" +
				"failure kind (so no infra re-place and no durable-SUCCESS override touches it), no infra\n" +
				"mark and no hold; failed also spends the retries left (a clear restores them). The try log\n" +
				"and the audit (operator_mark) name the operator. A queued or running attempt's agent is\n" +
				"told to stop at its next report. Refused on a run that is not running, on a success, skip\n" +
				"or upstream failure, and when the attempt moves on before the write."},
	}
}

// Usage is the text of reaperctl help.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: reaperctl COMMAND [flags] [args]\n\n")
	for _, cmd := range commands() {
		for _, form := range cmd.synopsis {
			fmt.Fprintf(&b, "  reaperctl %s %s\n", cmd.name, form)
		}
		fmt.Fprintf(&b, "      %s\n", cmd.summary)
	}
	b.WriteString(`  reaperctl help [COMMAND]
      this text, or a command's usage (also: reaperctl COMMAND -h)

Every command reads the board named by reaperd's configuration file:
  -config FILE   the HCL file (store.dsn, the ladder); REAPER_DSN overrides store.dsn
  -json          print one JSON document instead of tables

Commands that write the board (submit, mark, release) name their operator in
the audit: -by NAME, else the OS user. Every other command only reads, and
works with a read-only database role (deploy/sql/reaper-readonly.sql); a
writing command run with such a role is refused and changes nothing.

Exit status: 0 done; 1 failed (board unreachable, unknown run or task, a role
that may not write, ...); 2 malformed command line. A command that fails
writes nothing.
`)
	return b.String()
}

// Run runs one reaperctl command line (args without the program name) and
// returns its exit status.
func (c CLI) Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Every printer writes through inert: nothing an agent, a task or a
	// plugin wrote reaches the terminal as a control sequence.
	out, errOut := newInertWriter(stdout), newInertWriter(stderr)
	defer func() { _ = out.Flush(); _ = errOut.Flush() }()
	return c.run(ctx, args, out, errOut)
}

func (c CLI) run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "reaperctl: no command (see reaperctl help)")
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) == 1 {
			fmt.Fprint(stdout, Usage())
			return exitOK
		}
		if _, ok := lookup(args[1]); !ok {
			fmt.Fprintf(stderr, "reaperctl help: unknown command %q (see reaperctl help)\n", args[1])
			return exitUsage
		}
		// help CMD is CMD -h: the command registers its flags and prints.
		name, args = args[1], []string{args[1], "-h"}
	}
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "reaperctl: unknown command %q (see reaperctl help)\n", name)
		return exitUsage
	}
	inv := &invocation{cmd: cmd, args: args[1:], stdout: stdout}
	err := cmd.run(c, ctx, inv)
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "reaperctl %s: %s (see reaperctl %s -h)\n", name, oneLine(uerr.msg), name)
		return exitUsage
	case isInsufficientPrivilege(err) && cmd.writes:
		fmt.Fprintf(stderr, "reaperctl %s: the database role may not write the board (insufficient_privilege): nothing was changed; %s needs a role that may write\n",
			name, name)
		return exitFail
	case isInsufficientPrivilege(err):
		fmt.Fprintf(stderr, "reaperctl %s: the database role may not read what %s reads (insufficient_privilege): grant it deploy/sql/reaper-readonly.sql\n",
			name, name)
		return exitFail
	default:
		fmt.Fprintf(stderr, "reaperctl %s: %s\n", name, oneLine(err.Error()))
		return exitFail
	}
}

// isInsufficientPrivilege reports whether PostgreSQL refused err's
// statement for the role's privileges (SQLSTATE 42501).
func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

func lookup(name string) (command, bool) {
	for _, cmd := range commands() {
		if cmd.name == name {
			return cmd, true
		}
	}
	return command{}, false
}

// commandUsage is the usage of cmd, whose flags fs holds.
func commandUsage(cmd command, fs *flag.FlagSet) string {
	var b strings.Builder
	for i, form := range cmd.synopsis {
		lead := "usage:"
		if i > 0 {
			lead = "      "
		}
		fmt.Fprintf(&b, "%s reaperctl %s %s\n", lead, cmd.name, form)
	}
	fmt.Fprintf(&b, "\n%s\n\nflags:\n", cmd.help)
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}

// usageError is a malformed command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelpShown ends a command whose help was asked for and printed.
var errHelpShown = errors.New("help shown")

// invocation is one command's command line and output.
type invocation struct {
	cmd    command
	args   []string
	stdout io.Writer
	fs     *flag.FlagSet

	configPath string
	json       bool
}

// flags returns the command's flag set with the common flags registered.
// The flag package's own messages are discarded: parse reports errors in
// one line and prints usage itself.
func (inv *invocation) flags() *flag.FlagSet {
	inv.fs = flag.NewFlagSet(inv.cmd.name, flag.ContinueOnError)
	inv.fs.SetOutput(io.Discard)
	inv.fs.StringVar(&inv.configPath, "config", "", "reaperd's HCL configuration `FILE` (required)")
	inv.fs.BoolVar(&inv.json, "json", false, "print one JSON document instead of tables")
	return inv.fs
}

// operatorFlag registers -by on a writing command's flag set. The resolve
// it returns, called once the command line is parsed, names the operator:
// -by, else the OS user (defaultOperator), checked by
// lifecycle.CheckOperator (a malformed name is a usage error).
func (inv *invocation) operatorFlag() (resolve func() (string, error)) {
	by := inv.fs.String("by", "", "the operator's `NAME`, kept in the audit (default: the OS user)")
	return func() (string, error) {
		operator := *by
		if !flagSet(inv.fs, "by") {
			operator = defaultOperator()
		}
		if err := lifecycle.CheckOperator(operator); err != nil {
			return "", usagef("-by: %v", err)
		}
		return operator, nil
	}
}

// outputFlag registers -o (table or json, as -json) on the command's flag
// set. The check it returns, called once the command line is parsed, sets
// json for -o json and refuses any other format.
func (inv *invocation) outputFlag() (check func() error) {
	format := inv.fs.String("o", "table", "output `FORMAT`: table or json (as -json)")
	return func() error {
		switch *format {
		case "table":
		case "json":
			inv.json = true
		default:
			return usagef("-o %q: want table or json", *format)
		}
		return nil
	}
}

// parse parses the command line with flags anywhere among the positional
// arguments (everything after "--" is positional) and checks the count of
// positional arguments against [min, max] (max < 0: no limit).
func (inv *invocation) parse(min, max int) ([]string, error) {
	var pos []string
	args := inv.args
	for {
		err := inv.fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(inv.stdout, commandUsage(inv.cmd, inv.fs))
			return nil, errHelpShown
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		rest := inv.fs.Args()
		consumed := len(args) - len(rest)
		if len(rest) == 0 {
			break
		}
		if consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	switch {
	case len(pos) < min:
		return nil, usagef("missing arguments: reaperctl %s %s", inv.cmd.name, strings.Join(inv.cmd.synopsis, " | "))
	case max >= 0 && len(pos) > max:
		return nil, usagef("unexpected argument %q", pos[max])
	}
	if inv.configPath == "" {
		return nil, usagef("-config FILE is required")
	}
	return pos, nil
}

// flagSet reports whether the command line set the flag.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

func (c CLI) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// session is an open board.
type session struct {
	cfg    *config.Config
	pool   *pgxpool.Pool
	store  *board.Store
	writer *lifecycle.Writer
}

func (s *session) close() { s.pool.Close() }

// open reads the configuration and connects to its board: the database
// must answer and hold the schema this binary knows.
func (c CLI) open(ctx context.Context, path string) (*session, error) {
	cfg, err := config.Load(path, config.Options{Getenv: c.Getenv})
	if err != nil {
		var cerr *config.Error
		if errors.As(err, &cerr) {
			return nil, fmt.Errorf("configuration: %s", strings.ReplaceAll(cerr.Error(), "\n", "; "))
		}
		return nil, err
	}
	if cfg.StoreDSN == "" {
		return nil, fmt.Errorf("no database: set store.dsn in %s or REAPER_DSN", path)
	}
	pc, err := pgxpool.ParseConfig(cfg.StoreDSN)
	if err != nil {
		return nil, fmt.Errorf("the board's DSN (store.dsn or REAPER_DSN): %w", err)
	}
	board.FollowPrimary(pc) // a DSN naming a primary and its standbys: the primary
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = ConnectTimeoutDefault
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open the board: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the board: %w", err)
	}
	if err := board.CheckSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w (run reaperd migrate -config %s)", err, path)
	}
	return &session{
		cfg:    cfg,
		pool:   pool,
		store:  board.New(pool, board.Options{}),
		writer: lifecycle.New(pool, lifecycle.Options{}),
	}, nil
}
