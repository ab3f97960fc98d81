package parked_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"

	"example.com/parked"
)

// The tests run the reaper in the SDK's harness: an in-memory board with
// the Postgres board's guards, a scripted substrate (an attempt nobody
// scripted reads dead) and a fake clock. Nothing sleeps: rows are placed
// where a rule needs them relative to the harness's clock.

type bundle = sdktest.Rig[*parked.Reaper]

func setup(t testing.TB, edition string, values sdk.Values) *bundle {
	b := sdktest.NewRig(t, edition, parked.New(nil), values)
	// The stopwatch is the harness's fake clock: pages take no time, so a
	// pass drains as far as its page bound allows, the same on every run.
	b.R.WithStopwatch(b.H.Clock)
	return b
}

// park puts an attempt of runID/taskID parked in state since parkedFor ago.
func park(b *bundle, runID, taskID, state string, parkedFor time.Duration) sdk.Attempt {
	now := b.H.Now()
	return b.H.Board.Put(sdktest.TaskInstance{RunID: runID, TaskID: taskID, State: state,
		QueuedAt: now.Add(-parkedFor - 2*time.Minute), RunningAt: now.Add(-parkedFor - time.Minute),
		EndedAt: now.Add(-parkedFor)})
}

const (
	resched  = sdk.StateUpForReschedule
	deferred = sdk.StateDeferred
	failed   = sdk.StateFailed
)

var noWrites = sdktest.NoWrites[*parked.Reaper]

// expired is an attempt parked a day ago: far past the 6h default.
func expired(state string) func(b *bundle) sdk.Attempt {
	return func(b *bundle) sdk.Attempt { return park(b, "r", "t", state, 24*time.Hour) }
}

func TestGates(t *testing.T) {
	t.Parallel()
	sdktest.RunRules(t, setup, []sdktest.Rule[*parked.Reaper]{
		{Name: "FreshParkedAttempt_LeftAlone", Arrange: func(b *bundle) sdk.Attempt {
			return park(b, "r", "t", resched, 5*time.Hour)
		}, Want: "", WantState: resched, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			noWrites(t, b, a, ds)
			// The TTL is applied in the listing: the substrate is not even
			// asked about an attempt inside it.
			if n := len(b.H.Exec.LivenessCalls()); n != 0 {
				t.Fatalf("%d liveness calls", n)
			}
		}},
		{Name: "ParkedExactlyAtTTL_LeftAlone", Arrange: func(b *bundle) sdk.Attempt {
			return park(b, "r", "t", deferred, parked.TTLDefault)
		}, Want: "", WantState: deferred, Check: noWrites},
		{Name: "StaleAndAlive_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			b.H.Exec.Alive(a)
			return a
		}, Want: parked.LabelProcessAlive, WantState: resched, Check: noWrites},
		{Name: "StaleAndOrphanedGroupAlive_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.H.Exec.Orphaned(a) // agent dead, its task group alive: not dead
			return a
		}, Want: parked.LabelProcessAlive, WantState: deferred, Check: noWrites},
		{Name: "StaleAndUnknown_Defers", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.H.Exec.Unknown(a, "signal 0: EPERM")
			return a
		}, Want: parked.LabelQueryError, WantState: deferred, Check: noWrites},
		{Name: "StaleAndLivenessCallFails_Defers", Arrange: func(b *bundle) sdk.Attempt {
			b.H.Exec.FailLiveness(errors.New("record directory is a symlink"))
			return expired(resched)(b)
		}, Want: parked.LabelQueryError, WantState: resched, Check: noWrites},
		{Name: "StaleAndDead_UpForReschedule_MarkedGuardedProvisionally", Arrange: expired(resched),
			Want: parked.LabelExpired, WantState: failed, Check: checkMarked(resched, false)},
		{Name: "StaleAndDead_Deferred_MarkedGuardedProvisionally", Arrange: expired(deferred),
			Want: parked.LabelExpired, WantState: failed, Check: checkMarked(deferred, false)},
		{Name: "LaterEpoch_MarkPinnedToIt", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			b.H.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.Try, ti.Epoch = 2, 7 })
			return sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: 2, Epoch: 7}
		}, Want: parked.LabelExpired, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			if m := b.H.Board.Marks()[0]; m.Try != 2 || m.Epoch != 7 {
				t.Fatalf("mark %+v not pinned to try 2 epoch 7", m)
			}
		}},
		{Name: "MovedOnBetweenListAndMark_Noop", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			// The scheduler pokes it again between the listing and the mark:
			// a new epoch, back to none.
			b.H.Board.OnMark(func(m sdk.Mark) {
				b.H.Board.Replace(m.RunID, m.TaskID, false, sdk.StateNone, b.H.Now())
			})
			return a
		}, Want: sdk.LabelMarkNoop, WantState: sdk.StateNone, Check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			d := ds.For(a)[0]
			if d.Applied || d.Evidence[reap.EvNoopReason] != sdk.NoopMovedOn {
				t.Fatalf("decision %+v", d)
			}
			if row := b.H.Board.Row(a); row.Epoch != a.Epoch+1 || row.MarkReason != "" {
				t.Fatalf("the new attempt was touched: %+v", row)
			}
		}},
		{Name: "DeposedBetweenListAndMark_Noop", Arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.H.Board.OnMark(func(sdk.Mark) { b.H.Board.SetTerm(2) })
			return a
		}, Want: sdk.LabelMarkNoop, WantState: deferred, Check: func(t *testing.T, _ *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if r := ds.For(a)[0].Evidence[reap.EvNoopReason]; r != sdk.NoopDeposed {
				t.Fatalf("noop reason %q", r)
			}
		}},
		{Name: "HoldPolicy_Holds", Values: sdk.Values{"policy": "hold"}, Arrange: expired(deferred),
			Want: parked.LabelExpired, WantState: failed, Check: checkMarked(deferred, true)},
		{Name: "UpForRetry_NotThisReapersCase", Arrange: expired(sdk.StateUpForRetry),
			Want: "", WantState: sdk.StateUpForRetry, Check: noWrites},
		{Name: "ShorterTTL_Configured", Values: sdk.Values{"ttl": "30m"}, Arrange: func(b *bundle) sdk.Attempt {
			return park(b, "r", "t", deferred, 31*time.Minute)
		}, Want: parked.LabelExpired, WantState: failed},
		{Name: "Kube_ReadsLiveAndMarksProvisionally", Edition: ladder.EditionKube, Arrange: expired(resched),
			Want: parked.LabelExpired, WantState: failed, Check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				calls := b.H.Exec.LivenessCalls()
				if len(calls) != 1 || !calls[0].Live {
					t.Fatalf("liveness calls %+v: want one authoritative read", calls)
				}
				if row := b.H.Board.Row(a); !row.InfraConfirmedAt.IsZero() || row.LastFailureKind != sdk.FailureInfra {
					t.Fatalf("kube mark must stay provisional for the reconciler: %+v", row)
				}
			}},
	})
}

// checkMarked checks a mark of an attempt parked in from: on the infra rail,
// guarded on exactly that state, pinned, under the pass's term, never
// confirmed as made (a reaper may not: the host refuses it; confirmation is
// the sweep's, or the valve's on Lite), held only under the hold policy;
// and its decision's evidence.
func checkMarked(from string, held bool) func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
	return func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
		t.Helper()
		marks := b.H.Board.Marks()
		if len(marks) != 1 {
			t.Fatalf("%d marks", len(marks))
		}
		m := marks[0]
		if m.Attempt != a || len(m.FromStates) != 1 || m.FromStates[0] != from || m.Kind != sdk.MarkInfra ||
			m.Reason != parked.LabelExpired || m.Confirm || m.Hold != held || m.Term != b.H.Term || !m.At.Equal(b.H.Now()) {
			t.Fatalf("mark %+v", m)
		}
		row := b.H.Board.Row(a)
		if row.LastFailureKind != sdk.FailureInfra || !row.InfraConfirmedAt.IsZero() || row.Held != held ||
			!strings.HasPrefix(row.ErrorMessage, parked.LabelExpired+": ") {
			t.Fatalf("row %+v", row)
		}
		d := ds.For(a)[0]
		if !d.Applied || d.DryRun || d.Evidence[parked.EvParkedFor] != "24h0m0s" || d.Evidence[reap.EvLiveness] != "dead" ||
			d.Evidence[reap.EvSignal] != reap.SignalPositive || d.Evidence[reap.EvState] != from {
			t.Fatalf("decision %+v", d)
		}
	}
}

func TestDryRun_WritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	b.H.DryRun = true
	a := expired(deferred)(b)
	ds := b.Reap(t)
	if d := ds.For(a); len(d) != 1 || d[0].Label != parked.LabelExpired || d[0].Applied || !d[0].DryRun {
		t.Fatalf("decisions %+v", d)
	}
	if n := b.H.Board.Writes(); n != 0 {
		t.Fatalf("a dry run wrote %d times", n)
	}
	if row := b.H.Board.Row(a); row.State != deferred {
		t.Fatalf("row %+v", row)
	}
}

// TestMassExpiry_EveryPositiveDeathMarked_NeverBraked: 450 attempts past the
// TTL, all read dead, are settled in one pass that drains five pages. No
// mark here rests on silence alone, so nothing is held back.
func TestMassExpiry_EveryPositiveDeathMarked_NeverBraked(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	for i := range 450 {
		park(b, fmt.Sprintf("r%03d", i), "t", deferred, 24*time.Hour+time.Duration(i)*time.Second)
	}
	ds := b.Reap(t)
	if n := ds.Count(parked.LabelExpired); n != 450 || len(ds.Applied()) != 450 {
		t.Fatalf("%d parked_expired, %d applied, want 450 (labels %v)", n, len(ds.Applied()), countLabels(ds))
	}
	if n := ds.Count(sdk.LabelBrakeEngaged); n != 0 {
		t.Fatalf("the brake engaged %d times", n)
	}
	if b.H.StateOf(parked.Name) != nil {
		t.Fatalf("an exhausted listing kept a cursor: %s", b.H.StateOf(parked.Name))
	}
	// Settled: the next pass finds nothing.
	if ds := b.Reap(t); len(ds) != 0 {
		t.Fatalf("second pass: %v", countLabels(ds))
	}
}

// TestDrain_CursorKeptBetweenPasses: with one page a pass, 250 parked
// attempts that stay alive are judged a page per pass, oldest first, each
// pass going on from where the last stopped; the short page sends the next
// pass back to the oldest.
func TestDrain_CursorKeptBetweenPasses(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, sdk.Values{"drain_max_pages": 1.0})
	b.H.Exec.SetDefault(sdk.Alive)
	for i := range 250 {
		// r000 parked longest ago: the oldest.
		park(b, fmt.Sprintf("r%03d", i), "t", resched, 48*time.Hour-time.Duration(i)*time.Second)
	}
	for pass, want := range []struct {
		n           int
		first, last string
	}{{100, "r000", "r099"}, {100, "r100", "r199"}, {50, "r200", "r249"}, {100, "r000", "r099"}} {
		ds := b.Reap(t)
		if len(ds) != want.n || ds[0].Attempt.RunID != want.first || ds[len(ds)-1].Attempt.RunID != want.last {
			t.Fatalf("pass %d: %d decisions from %s to %s, want %d from %s to %s", pass+1, len(ds),
				ds[0].Attempt.RunID, ds[len(ds)-1].Attempt.RunID, want.n, want.first, want.last)
		}
		if ds.Count(parked.LabelProcessAlive) != want.n {
			t.Fatalf("pass %d: %v", pass+1, countLabels(ds))
		}
	}
	if n := b.H.Board.Writes(); n != 0 {
		t.Fatalf("%d writes on attempts that are alive", n)
	}
}

func TestBoardError_EndsThePassAndKeepsTheCursor(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	expired(deferred)(b)
	b.H.SetState(parked.Name, []byte(`{"v":1,"cursors":{"parked":{"at":"2030-01-01T00:00:00Z","run":"a","task":"b"}}}`))
	b.H.Board.Fail(sdktest.OpListCandidates, errors.New("connection reset"))
	if _, err := b.H.Reap(context.Background(), b.R); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(string(b.H.Last.State), `"run":"a"`) {
		t.Fatalf("the failing page's cursor was lost: %s", b.H.Last.State)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, err := parked.New(nil).ConfigSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range schema.Attributes {
		names = append(names, fmt.Sprintf("%s=%v", a.Name, a.Default))
	}
	if got := strings.Join(names, " "); got != "ttl=6h0m0s policy=replace drain_max_pages=0" {
		t.Fatalf("schema %s", got)
	}
	for _, tc := range []struct {
		name   string
		values sdk.Values
		want   string
	}{
		{"ZeroTTL_Refused", sdk.Values{"ttl": "0s"}, `attribute "ttl": must be positive, got 0s`},
		{"NegativeTTL_Refused", sdk.Values{"ttl": "-1h"}, `attribute "ttl": must be positive, got -1h0m0s`},
		{"BadDuration_Refused", sdk.Values{"ttl": "six hours"}, `attribute "ttl": not a duration`},
		{"UnknownPolicy_Refused", sdk.Values{"policy": "keep"}, `attribute "policy": must be "replace" or "hold", got "keep"`},
		{"UnknownAttribute_Refused", sdk.Values{"tll": "1h"}, `attribute "tll": not a setting of this plugin`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := sdktest.New(ladder.EditionLite)
			err := h.Configure(ctx, parked.New(nil), tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %s", err, tc.want)
			}
		})
	}
}

func countLabels(ds sdktest.Decisions) map[string]int {
	out := map[string]int{}
	for _, d := range ds {
		out[d.Label]++
	}
	return out
}
