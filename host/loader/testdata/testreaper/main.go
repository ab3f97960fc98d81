// Command testreaper is a reaper plugin used by the host's tests. It takes
// its name from its file name (reaper-<name>), so one build serves as
// several plugins. Its pass lists candidates from the host's board, asks the
// host's substrate proxy about them, marks the dead ones, and reports a
// decision for each. Configured with mode = "crash" it exits in the middle
// of a pass; with mode = "hang" it blocks until the pass is cancelled. The
// environment variable TESTREAPER_PROTOCOLS (comma-separated) overrides the
// protocol versions it serves. With mode = "report" its pass records 150
// decisions, then 2,350 more; with "report_fail" it records 150 and 5, then
// fails. With "mark_teardown" it marks the dead attempts, then tears each
// one down before it records its decisions (as the kube reapers do); with
// "mark_crash" it exits right after its marks, before any decision. The
// hostile modes: "forge_success" marks every successful attempt an infra
// failure; "late_write" writes to the board after its pass returned;
// "backdate" marks the running attempts at a time an hour before its pass;
// "confirm" marks them confirmed as they are made; "foreign_name" records a
// decision about them under another reaper's name; "undeclared_label"
// records one under a label it did not declare;
// "big_reply" answers with a reply far larger than the host accepts; "env"
// hands back its own environment as its state; "probe" tries to read each
// file its probe attribute names (one a line) and hands back, as its state,
// JSON of what each read gave ("read", or the errno's name).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk/plugin"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

type reaper struct {
	name   string
	mode   string
	marker string
	probe  string
}

func newReaper(hclog.Logger) *reaper {
	return &reaper{name: strings.TrimPrefix(filepath.Base(os.Args[0]), "reaper-")}
}

func (r *reaper) Info(context.Context) (sdk.Info, error) {
	info := sdk.Info{Name: r.name, Kind: sdk.KindReaper, Version: "test", Editions: []string{"lite", "kube"},
		MarkReasons:    []string{sdk.LabelAgentLost},
		DecisionLabels: []string{sdk.LabelAgentLostProcessAlive, sdk.LabelAgentLostPodDeleteErr}}
	// TESTREAPER_DECLARE (comma-separated, "n*label" for n of them)
	// replaces the labels it declares.
	if v, ok := os.LookupEnv("TESTREAPER_DECLARE"); ok {
		info.DecisionLabels = nil
		for _, l := range strings.Split(v, ",") {
			n, label, many := strings.Cut(l, "*")
			if !many {
				info.DecisionLabels = append(info.DecisionLabels, l)
				continue
			}
			count, _ := strconv.Atoi(n)
			for i := range count {
				info.DecisionLabels = append(info.DecisionLabels, label+strconv.Itoa(i))
			}
		}
	}
	return info, nil
}

func (r *reaper) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "mode", Type: sdk.TypeString, Default: "normal"},
		{Name: "threshold", Type: sdk.TypeDuration, Default: "90s"},
		{Name: "required_thing", Type: sdk.TypeString, Required: r.name == "strict"},
		{Name: "crash_marker", Type: sdk.TypeString, Default: ""},
		{Name: "probe", Type: sdk.TypeString, Default: ""},
	}}, nil
}

func (r *reaper) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	r.mode = req.Values.String("mode")
	r.marker = req.Values.String("crash_marker")
	r.probe = req.Values.String("probe")
	switch r.mode {
	case "normal", "crash", "hang", "crash_once", "report", "report_fail", "mark_teardown", "mark_crash",
		"forge_success", "late_write", "big_reply", "env", "probe", "backdate", "confirm", "foreign_name", "undeclared_label":
		return nil
	}
	return fmt.Errorf(`attribute "mode": must be "normal", "crash", "crash_once", "hang", "report", "report_fail", "mark_teardown", "mark_crash", "forge_success", "late_write", "big_reply", "env", "probe", "backdate", "confirm", "foreign_name" or "undeclared_label", not %q`, r.mode)
}

func (r *reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	switch r.mode {
	case "crash":
		os.Exit(3)
	case "crash_once":
		if _, err := os.Stat(r.marker); err != nil {
			if err := os.WriteFile(r.marker, nil, 0o600); err == nil {
				os.Exit(3)
			}
		}
	case "hang":
		<-ctx.Done()
		return sdk.PassResult{}, ctx.Err()
	case "report":
		return reportPass(ctx, pass, sink, 150, 2350, nil)
	case "report_fail":
		return reportPass(ctx, pass, sink, 150, 5, errors.New("failed on purpose"))
	case "forge_success":
		return forgeSuccess(ctx, pass, board)
	case "late_write":
		return lateWrite(ctx, pass, board)
	case "backdate", "confirm", "foreign_name", "undeclared_label":
		return overreach(ctx, r.mode, pass, board, sink)
	case "big_reply":
		// A reply far larger than the host accepts.
		return sdk.PassResult{State: make([]byte, 8<<20)}, nil
	case "env":
		// The plugin's whole environment, as its pass's state.
		return sdk.PassResult{State: []byte(strings.Join(os.Environ(), "\x00"))}, nil
	case "probe":
		return sdk.PassResult{State: probe(r.probe)}, nil
	}
	page, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldHeartbeatAt,
		OlderThan: pass.Now.Add(-pass.Ladder.AgentLost), Heartbeat: sdk.HeartbeatSeen,
	})
	if err != nil {
		return sdk.PassResult{}, err
	}
	attempts := make([]sdk.Attempt, len(page.Candidates))
	for i, c := range page.Candidates {
		attempts[i] = c.Attempt
	}
	live, err := exec.Liveness(ctx, sdk.LivenessRequest{Attempts: attempts, Now: pass.Now})
	if err != nil {
		return sdk.PassResult{}, err
	}
	var marks []sdk.Mark
	var decisions []sdk.Decision
	for _, l := range live {
		if l.State != sdk.Dead {
			decisions = append(decisions, sdk.Decision{Label: sdk.LabelAgentLostProcessAlive, Attempt: l.Attempt,
				Evidence: map[string]string{"liveness": string(l.State)}})
			continue
		}
		marks = append(marks, sdk.Mark{Attempt: l.Attempt, FromStates: []string{sdk.StateRunning},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Term: pass.Term, At: pass.Now})
	}
	results, err := board.Mark(ctx, marks)
	if err != nil {
		return sdk.PassResult{}, err
	}
	switch r.mode {
	case "mark_crash":
		os.Exit(3)
	case "mark_teardown":
		for _, res := range results {
			if !res.Applied {
				continue
			}
			a := res.Attempt
			if _, err := exec.Teardown(ctx, sdk.TeardownRequest{Attempt: &a, Reason: sdk.LabelAgentLost, Term: pass.Term}); err != nil {
				decisions = append(decisions, sdk.Decision{Label: sdk.LabelAgentLostPodDeleteErr, Attempt: a, Detail: err.Error()})
			}
		}
	}
	for _, res := range results {
		decisions = append(decisions, sdk.Decision{Label: sdk.LabelAgentLost, Attempt: res.Attempt, Applied: res.Applied,
			Evidence: map[string]string{"term": strconv.FormatInt(pass.Term, 10)}})
	}
	if err := sink.Record(ctx, decisions); err != nil {
		return sdk.PassResult{}, err
	}
	return sdk.PassResult{State: append(pass.State, 'x')}, nil
}

// forgeSuccess is a hostile reaper: it lists the successful attempts and
// marks each one a confirmed infra failure, naming success among the
// states to move it from, and records nothing.
func forgeSuccess(ctx context.Context, pass sdk.Pass, board sdk.Board) (sdk.PassResult, error) {
	page, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateSuccess}, OrderBy: sdk.FieldRunningAt, OlderThan: pass.Now,
	})
	if err != nil {
		return sdk.PassResult{}, err
	}
	var marks []sdk.Mark
	for _, c := range page.Candidates {
		marks = append(marks, sdk.Mark{Attempt: c.Attempt, FromStates: []string{sdk.StateRunning, sdk.StateSuccess},
			Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost, Message: "agent_lost: forged",
			Term: pass.Term, At: pass.Now})
	}
	if _, err := board.Mark(ctx, marks); err != nil {
		return sdk.PassResult{}, err
	}
	return sdk.PassResult{}, nil
}

// lateWrite is a hostile reaper: its pass lists the running attempts and
// returns at once, leaving behind a goroutine that keeps appending a try
// log line to them until the host refuses it (the pass is closed), then
// marks them. It records nothing.
func lateWrite(ctx context.Context, pass sdk.Pass, board sdk.Board) (sdk.PassResult, error) {
	page, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: pass.Now,
	})
	if err != nil || len(page.Candidates) == 0 {
		return sdk.PassResult{}, err
	}
	a := page.Candidates[0].Attempt
	go func() {
		bg := context.WithoutCancel(ctx)
		for range 10_000 {
			err := board.AppendLog(bg, pass.Term, []sdk.LogLine{{Attempt: a, At: pass.Now, Line: "written late"}})
			if err != nil && strings.Contains(err.Error(), "pass is over") {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		_, _ = board.Mark(bg, []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: late", Term: pass.Term, At: pass.Now}})
	}()
	return sdk.PassResult{}, nil
}

// overreach is a hostile reaper that asks the host for what the host, not
// a plugin, decides, about every running attempt: a mark fenced an hour
// before its pass (backdate) or confirmed as it is made (confirm), a
// decision filed under another reaper's name (foreign_name) or under a
// label it never declared (undeclared_label). It records nothing else.
func overreach(ctx context.Context, mode string, pass sdk.Pass, board sdk.Board, sink sdk.Sink) (sdk.PassResult, error) {
	page, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: pass.Now,
	})
	if err != nil {
		return sdk.PassResult{}, err
	}
	var marks []sdk.Mark
	var decisions []sdk.Decision
	for _, c := range page.Candidates {
		m := sdk.Mark{Attempt: c.Attempt, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: " + mode, Term: pass.Term, At: pass.Now}
		switch mode {
		case "backdate":
			m.At = pass.Now.Add(-time.Hour)
			marks = append(marks, m)
		case "confirm":
			m.Confirm = true
			marks = append(marks, m)
		case "foreign_name":
			decisions = append(decisions, sdk.Decision{Reaper: "podlost", Label: sdk.LabelAgentLostProcessAlive,
				Attempt: c.Attempt, Detail: "filed under another reaper"})
		case "undeclared_label":
			decisions = append(decisions, sdk.Decision{Label: "made_up_" + strconv.FormatInt(pass.Now.UnixNano(), 10),
				Attempt: c.Attempt, Detail: "a label no one declared"})
		}
	}
	if len(marks) > 0 {
		res, err := board.Mark(ctx, marks)
		if err != nil {
			return sdk.PassResult{}, err
		}
		for _, r := range res {
			if r.Applied {
				return sdk.PassResult{}, fmt.Errorf("the host applied a %s mark of %s", mode, r.Attempt)
			}
		}
	}
	if err := sink.Record(ctx, decisions); err != nil {
		return sdk.PassResult{}, err
	}
	return sdk.PassResult{}, nil
}

// reportPass records decisions about tasks t0000, t0001, ... in two
// batches, then returns err.
func reportPass(ctx context.Context, pass sdk.Pass, sink sdk.Sink, early, late int, err error) (sdk.PassResult, error) {
	ds := make([]sdk.Decision, early+late)
	for i := range ds {
		ds[i] = sdk.Decision{Label: sdk.LabelAgentLost, Attempt: sdk.Attempt{RunID: "r", TaskID: fmt.Sprintf("t%04d", i), Try: 1},
			Applied: true, Evidence: map[string]string{"term": strconv.FormatInt(pass.Term, 10), "n": strconv.Itoa(i)}}
	}
	if err := sink.Record(ctx, ds[:early]); err != nil {
		return sdk.PassResult{}, err
	}
	if err := sink.Record(ctx, ds[early:]); err != nil {
		return sdk.PassResult{}, err
	}
	return sdk.PassResult{State: []byte("reported")}, err
}

// probe reads each file named in paths (one a line) and says, as JSON,
// what each read gave: "read", or the name of the errno that refused it.
func probe(paths string) []byte {
	out := map[string]string{}
	for _, p := range strings.Split(paths, "\n") {
		if p == "" {
			continue
		}
		_, err := os.ReadFile(p)
		var errno syscall.Errno
		switch {
		case err == nil:
			out[p] = "read"
		case errors.As(err, &errno):
			out[p] = unix.ErrnoName(errno)
		default:
			out[p] = err.Error()
		}
	}
	b, _ := json.Marshal(out)
	return b
}

func main() {
	var opts []plugin.ServeOption
	if v := os.Getenv("TESTREAPER_PROTOCOLS"); v != "" {
		var versions []int
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				os.Exit(2)
			}
			versions = append(versions, n)
		}
		opts = append(opts, plugin.WithProtocolVersions(versions...))
	}
	plugin.Serve(newReaper, opts...)
}
