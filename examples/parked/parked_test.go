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

type bundle struct {
	h *sdktest.Harness
	r *parked.Reaper
}

func setup(t testing.TB, edition string, values sdk.Values) *bundle {
	t.Helper()
	h := sdktest.New(edition)
	// The stopwatch is the harness's fake clock: pages take no time, so a
	// pass drains as far as its page bound allows, the same on every run.
	r := parked.New(nil).WithStopwatch(h.Clock)
	if err := h.Configure(context.Background(), r, values); err != nil {
		t.Fatalf("configure: %v", err)
	}
	return &bundle{h: h, r: r}
}

func (b *bundle) reap(t testing.TB) sdktest.Decisions {
	t.Helper()
	ds, err := b.h.Reap(context.Background(), b.r)
	if err != nil {
		t.Fatalf("reap: %v", err)
	}
	return ds
}

// park puts an attempt of runID/taskID parked in state since parkedFor ago.
func (b *bundle) park(runID, taskID, state string, parkedFor time.Duration) sdk.Attempt {
	now := b.h.Now()
	return b.h.Board.Put(sdktest.TaskInstance{RunID: runID, TaskID: taskID, State: state,
		QueuedAt: now.Add(-parkedFor - 2*time.Minute), RunningAt: now.Add(-parkedFor - time.Minute),
		EndedAt: now.Add(-parkedFor)})
}

const (
	resched  = sdk.StateUpForReschedule
	deferred = sdk.StateDeferred
	failed   = sdk.StateFailed
)

type ruleCase struct {
	name      string
	edition   string
	values    sdk.Values
	arrange   func(b *bundle) sdk.Attempt
	want      string // the labels of the decisions about the attempt
	wantState string
	check     func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions)
}

func runRules(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			edition := tc.edition
			if edition == "" {
				edition = ladder.EditionLite
			}
			b := setup(t, edition, tc.values)
			a := tc.arrange(b)
			ds := b.reap(t)
			if got := ds.Label(a); got != tc.want {
				t.Fatalf("decisions %q, want %q (all: %+v)", got, tc.want, ds)
			}
			if got := b.h.Board.Row(a).State; got != tc.wantState {
				t.Fatalf("row state %q, want %q", got, tc.wantState)
			}
			if n := b.h.Exec.Actions(); n != 0 {
				t.Fatalf("%d stops or teardowns: this reaper never stops anything", n)
			}
			if tc.check != nil {
				tc.check(t, b, a, ds)
			}
		})
	}
}

func noWrites(t *testing.T, b *bundle, _ sdk.Attempt, _ sdktest.Decisions) {
	t.Helper()
	if n := b.h.Board.Writes(); n != 0 {
		t.Fatalf("%d writes", n)
	}
}

// expired is an attempt parked a day ago: far past the 6h default.
func expired(state string) func(b *bundle) sdk.Attempt {
	return func(b *bundle) sdk.Attempt { return b.park("r", "t", state, 24*time.Hour) }
}

func TestGates(t *testing.T) {
	t.Parallel()
	runRules(t, []ruleCase{
		{name: "FreshParkedAttempt_LeftAlone", arrange: func(b *bundle) sdk.Attempt {
			return b.park("r", "t", resched, 5*time.Hour)
		}, want: "", wantState: resched, check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			noWrites(t, b, a, ds)
			// The TTL is applied in the listing: the substrate is not even
			// asked about an attempt inside it.
			if n := len(b.h.Exec.LivenessCalls()); n != 0 {
				t.Fatalf("%d liveness calls", n)
			}
		}},
		{name: "ParkedExactlyAtTTL_LeftAlone", arrange: func(b *bundle) sdk.Attempt {
			return b.park("r", "t", deferred, parked.TTLDefault)
		}, want: "", wantState: deferred, check: noWrites},
		{name: "StaleAndAlive_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			b.h.Exec.Alive(a)
			return a
		}, want: parked.LabelProcessAlive, wantState: resched, check: noWrites},
		{name: "StaleAndOrphanedGroupAlive_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.h.Exec.Orphaned(a) // agent dead, its task group alive: not dead
			return a
		}, want: parked.LabelProcessAlive, wantState: deferred, check: noWrites},
		{name: "StaleAndUnknown_Defers", arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.h.Exec.Unknown(a, "signal 0: EPERM")
			return a
		}, want: parked.LabelQueryError, wantState: deferred, check: noWrites},
		{name: "StaleAndLivenessCallFails_Defers", arrange: func(b *bundle) sdk.Attempt {
			b.h.Exec.FailLiveness(errors.New("record directory is a symlink"))
			return expired(resched)(b)
		}, want: parked.LabelQueryError, wantState: resched, check: noWrites},
		{name: "StaleAndDead_UpForReschedule_MarkedGuardedProvisionally", arrange: expired(resched),
			want: parked.LabelExpired, wantState: failed, check: checkMarked(resched, false)},
		{name: "StaleAndDead_Deferred_MarkedGuardedProvisionally", arrange: expired(deferred),
			want: parked.LabelExpired, wantState: failed, check: checkMarked(deferred, false)},
		{name: "LaterEpoch_MarkPinnedToIt", arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			b.h.Board.Update(a.RunID, a.TaskID, func(ti *sdktest.TaskInstance) { ti.Try, ti.Epoch = 2, 7 })
			return sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: 2, Epoch: 7}
		}, want: parked.LabelExpired, wantState: failed, check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
			if m := b.h.Board.Marks()[0]; m.Try != 2 || m.Epoch != 7 {
				t.Fatalf("mark %+v not pinned to try 2 epoch 7", m)
			}
		}},
		{name: "MovedOnBetweenListAndMark_Noop", arrange: func(b *bundle) sdk.Attempt {
			a := expired(resched)(b)
			// The scheduler pokes it again between the listing and the mark:
			// a new epoch, back to none.
			b.h.Board.OnMark(func(m sdk.Mark) {
				b.h.Board.Replace(m.RunID, m.TaskID, false, sdk.StateNone, b.h.Now())
			})
			return a
		}, want: sdk.LabelMarkNoop, wantState: sdk.StateNone, check: func(t *testing.T, b *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			d := ds.For(a)[0]
			if d.Applied || d.Evidence[reap.EvNoopReason] != sdk.NoopMovedOn {
				t.Fatalf("decision %+v", d)
			}
			if row := b.h.Board.Row(a); row.Epoch != a.Epoch+1 || row.MarkReason != "" {
				t.Fatalf("the new attempt was touched: %+v", row)
			}
		}},
		{name: "DeposedBetweenListAndMark_Noop", arrange: func(b *bundle) sdk.Attempt {
			a := expired(deferred)(b)
			b.h.Board.OnMark(func(sdk.Mark) { b.h.Board.SetTerm(2) })
			return a
		}, want: sdk.LabelMarkNoop, wantState: deferred, check: func(t *testing.T, _ *bundle, a sdk.Attempt, ds sdktest.Decisions) {
			if r := ds.For(a)[0].Evidence[reap.EvNoopReason]; r != sdk.NoopDeposed {
				t.Fatalf("noop reason %q", r)
			}
		}},
		{name: "HoldPolicy_Holds", values: sdk.Values{"policy": "hold"}, arrange: expired(deferred),
			want: parked.LabelExpired, wantState: failed, check: checkMarked(deferred, true)},
		{name: "UpForRetry_NotThisReapersCase", arrange: expired(sdk.StateUpForRetry),
			want: "", wantState: sdk.StateUpForRetry, check: noWrites},
		{name: "ShorterTTL_Configured", values: sdk.Values{"ttl": "30m"}, arrange: func(b *bundle) sdk.Attempt {
			return b.park("r", "t", deferred, 31*time.Minute)
		}, want: parked.LabelExpired, wantState: failed},
		{name: "Kube_ReadsLiveAndMarksProvisionally", edition: ladder.EditionKube, arrange: expired(resched),
			want: parked.LabelExpired, wantState: failed, check: func(t *testing.T, b *bundle, a sdk.Attempt, _ sdktest.Decisions) {
				calls := b.h.Exec.LivenessCalls()
				if len(calls) != 1 || !calls[0].Live {
					t.Fatalf("liveness calls %+v: want one authoritative read", calls)
				}
				if row := b.h.Board.Row(a); !row.InfraConfirmedAt.IsZero() || row.LastFailureKind != sdk.FailureInfra {
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
		marks := b.h.Board.Marks()
		if len(marks) != 1 {
			t.Fatalf("%d marks", len(marks))
		}
		m := marks[0]
		if m.Attempt != a || len(m.FromStates) != 1 || m.FromStates[0] != from || m.Kind != sdk.MarkInfra ||
			m.Reason != parked.LabelExpired || m.Confirm || m.Hold != held || m.Term != b.h.Term || !m.At.Equal(b.h.Now()) {
			t.Fatalf("mark %+v", m)
		}
		row := b.h.Board.Row(a)
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
	b.h.DryRun = true
	a := expired(deferred)(b)
	ds := b.reap(t)
	if d := ds.For(a); len(d) != 1 || d[0].Label != parked.LabelExpired || d[0].Applied || !d[0].DryRun {
		t.Fatalf("decisions %+v", d)
	}
	if n := b.h.Board.Writes(); n != 0 {
		t.Fatalf("a dry run wrote %d times", n)
	}
	if row := b.h.Board.Row(a); row.State != deferred {
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
		b.park(fmt.Sprintf("r%03d", i), "t", deferred, 24*time.Hour+time.Duration(i)*time.Second)
	}
	ds := b.reap(t)
	if n := ds.Count(parked.LabelExpired); n != 450 || len(ds.Applied()) != 450 {
		t.Fatalf("%d parked_expired, %d applied, want 450 (labels %v)", n, len(ds.Applied()), countLabels(ds))
	}
	if n := ds.Count(sdk.LabelBrakeEngaged); n != 0 {
		t.Fatalf("the brake engaged %d times", n)
	}
	if b.h.StateOf(parked.Name) != nil {
		t.Fatalf("an exhausted listing kept a cursor: %s", b.h.StateOf(parked.Name))
	}
	// Settled: the next pass finds nothing.
	if ds := b.reap(t); len(ds) != 0 {
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
	b.h.Exec.SetDefault(sdk.Alive)
	for i := range 250 {
		// r000 parked longest ago: the oldest.
		b.park(fmt.Sprintf("r%03d", i), "t", resched, 48*time.Hour-time.Duration(i)*time.Second)
	}
	for pass, want := range []struct {
		n           int
		first, last string
	}{{100, "r000", "r099"}, {100, "r100", "r199"}, {50, "r200", "r249"}, {100, "r000", "r099"}} {
		ds := b.reap(t)
		if len(ds) != want.n || ds[0].Attempt.RunID != want.first || ds[len(ds)-1].Attempt.RunID != want.last {
			t.Fatalf("pass %d: %d decisions from %s to %s, want %d from %s to %s", pass+1, len(ds),
				ds[0].Attempt.RunID, ds[len(ds)-1].Attempt.RunID, want.n, want.first, want.last)
		}
		if ds.Count(parked.LabelProcessAlive) != want.n {
			t.Fatalf("pass %d: %v", pass+1, countLabels(ds))
		}
	}
	if n := b.h.Board.Writes(); n != 0 {
		t.Fatalf("%d writes on attempts that are alive", n)
	}
}

func TestBoardError_EndsThePassAndKeepsTheCursor(t *testing.T) {
	t.Parallel()
	b := setup(t, ladder.EditionLite, nil)
	expired(deferred)(b)
	b.h.SetState(parked.Name, []byte(`{"v":1,"cursors":{"parked":{"at":"2030-01-01T00:00:00Z","run":"a","task":"b"}}}`))
	b.h.Board.Fail(sdktest.OpListCandidates, errors.New("connection reset"))
	if _, err := b.h.Reap(context.Background(), b.r); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(string(b.h.Last.State), `"run":"a"`) {
		t.Fatalf("the failing page's cursor was lost: %s", b.h.Last.State)
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
