// Command testsubstrate is a substrate plugin used by the host's tests. It
// takes its name from its file name (reaper-substrate-<name>). It reports
// every attempt dead unless its run id starts with "alive", is always
// synced, stops every orphan, and its sweep lists candidates through the
// host's board (proving the broker callback for substrates).
//
// Named "reconcile", its sweep plays a reconciler over the host's board
// instead: it lists the provisional infra marks, confirms the first, third,
// ... and overrides the second, fourth, ... as durable successes, settles
// every running attempt as a success, and appends "confirmed by the sweep"
// to the log of each attempt it confirmed.
//
// With a probe attribute (file paths, one a line), its StopOrphan answers,
// as its detail, JSON of what reading each file gave ("read", or the
// errno's name).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk/plugin"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

type substrate struct{ name, probe string }

func newSubstrate(hclog.Logger) *substrate {
	return &substrate{name: strings.TrimPrefix(filepath.Base(os.Args[0]), "reaper-substrate-")}
}

func (s *substrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: s.name, Kind: sdk.KindSubstrate, Version: "test", Editions: []string{"lite", "kube"}}, nil
}

func (s *substrate) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{{Name: "record_dir", Type: sdk.TypeString, Default: ""},
		{Name: "probe", Type: sdk.TypeString, Default: ""}}}, nil
}

func (s *substrate) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	s.probe = req.Values.String("probe")
	return nil
}

func (s *substrate) Sweep(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
	if s.name == "reconcile" {
		return reconcile(ctx, req, board)
	}
	if _, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: req.Now,
	}); err != nil {
		return sdk.SweepResult{}, err
	}
	return sdk.SweepResult{}, nil
}

// valve is the infra confirmation valve the reconciling sweep honours.
const valve = 2 * time.Minute

func reconcile(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
	marks, err := board.ListProvisional(ctx, sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorKube}})
	if err != nil {
		return sdk.SweepResult{}, err
	}
	var (
		confirms  []sdk.Confirm
		overrides []sdk.Override
		lines     []sdk.LogLine
		reasons   []string
	)
	for i, c := range marks.Candidates {
		if i%2 == 0 {
			confirms = append(confirms, sdk.Confirm{Attempt: c.Attempt, Term: req.Term, At: req.Now})
			lines = append(lines, sdk.LogLine{Attempt: c.Attempt, At: req.Now, Line: "confirmed by the sweep"})
			continue
		}
		overrides = append(overrides, sdk.Override{Attempt: c.Attempt, MarkedAfter: req.Now.Add(-valve), Term: req.Term, At: req.Now})
		reasons = append(reasons, c.FailureReason)
	}
	if _, err := board.ConfirmInfra(ctx, confirms); err != nil {
		return sdk.SweepResult{}, err
	}
	res := sdk.SweepResult{Overrides: map[string]int64{}}
	applied, err := board.OverrideInfra(ctx, overrides)
	if err != nil {
		return sdk.SweepResult{}, err
	}
	for i, r := range applied {
		if r.Applied {
			res.Overrides[reasons[i]]++
		}
	}
	running, err := board.ListCandidates(ctx, sdk.CandidateQuery{
		States: []string{sdk.StateRunning}, OrderBy: sdk.FieldRunningAt, OlderThan: req.Now,
	})
	if err != nil {
		return sdk.SweepResult{}, err
	}
	// The pod cache's history first: each running attempt's recorded pod
	// reached the cache Running half an hour after the attempt ran.
	var sightings []sdk.PodSighting
	for _, c := range running.Candidates {
		if c.PodUID != "" {
			sightings = append(sightings, sdk.PodSighting{Attempt: c.Attempt, PodUID: c.PodUID,
				SeenAt: c.RunningAt.Add(30 * time.Minute), Term: req.Term, At: req.Now})
		}
	}
	if _, err := board.RecordPodSightings(ctx, sightings); err != nil {
		return sdk.SweepResult{}, err
	}
	var settle []sdk.Settlement
	for _, c := range running.Candidates {
		settle = append(settle, sdk.Settlement{Attempt: c.Attempt, Outcome: sdk.OutcomeSuccess,
			FromStates: []string{sdk.StateRunning}, Term: req.Term, At: req.Now})
	}
	if _, err := board.Settle(ctx, settle); err != nil {
		return sdk.SweepResult{}, err
	}
	if len(lines) > 0 {
		if err := board.AppendLog(ctx, req.Term, lines); err != nil {
			return sdk.SweepResult{}, err
		}
	}
	return res, nil
}

func (s *substrate) Synced(context.Context) (bool, error) { return true, nil }

func (s *substrate) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		st := sdk.Dead
		if strings.HasPrefix(a.RunID, "alive") {
			st = sdk.Alive
		}
		out[i] = sdk.AttemptLiveness{Attempt: a, State: st, Agent: st, Group: st}
	}
	return out, nil
}

func (s *substrate) Teardown(context.Context, sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return []sdk.TeardownOutcome{{Action: sdk.TeardownNothing}}, nil
}

func (s *substrate) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	if s.probe != "" {
		return sdk.StopResult{Detail: probe(s.probe)}, nil
	}
	return sdk.StopResult{Stopped: true}, nil
}

func (s *substrate) WarmWorkers(context.Context) ([]sdk.WarmWorker, error) { return nil, nil }

// probe reads each file named in paths (one a line) and says, as JSON,
// what each read gave: "read", or the name of the errno that refused it.
func probe(paths string) string {
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
	return string(b)
}

func main() { plugin.Serve(newSubstrate) }
