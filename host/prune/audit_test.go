package prune_test

import (
	"context"
	"testing"
	"time"

	pgboard "github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/prune"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/byhand"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// heldPrune is the board's prune, held at its first statement until
// released: entered says a batch began.
type heldPrune struct {
	*pgboard.Store
	entered, release chan struct{}
}

func (h *heldPrune) PruneDecisions(ctx context.Context, term int64, now, before time.Time, limit int) (int64, error) {
	h.entered <- struct{}{}
	<-h.release
	return h.Store.PruneDecisions(ctx, term, now, before, limit)
}

// The leader keeps the audit to its retention beside its cycles: a batch
// deletes the decisions and the warm workers' claims older than the
// retention and keeps every younger one (what explain tells, the shadow
// decision still within its horizon); cycles go on while a batch is held,
// and no second batch begins while one is under way (its ticks are
// coalesced).
func TestTheLeaderPrunesTheAuditPastItsRetentionBesideItsCycles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := pgtest.NewDB(t)
	store := pgboard.New(pool, pgboard.Options{})
	lw := lifecycle.New(pool, lifecycle.Options{})
	if err := lw.CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "dag", State: sdk.RunRunning,
		Tasks: []lifecycle.NewTask{{TaskID: "t", Executor: sdk.ExecutorLite, Command: "true"}}}, t0.Add(-200*time.Hour)); err != nil {
		t.Fatal(err)
	}
	lease, _, err := store.TryAcquire(ctx, "test", 72*time.Hour, t0.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	old := []sdk.Decision{
		{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a},
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, DryRun: true, Evidence: map[string]string{"edition": "lite"}},
	}
	young := []sdk.Decision{
		{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, Evidence: map[string]string{"liveness": "alive"}},
		{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, DryRun: true, Evidence: map[string]string{"edition": "lite"}},
	}
	for _, w := range []struct {
		at time.Time
		ds []sdk.Decision
	}{{t0.Add(-100 * time.Hour), old}, {t0.Add(-71 * time.Hour), young[:1]}, {t0.Add(-time.Hour), young[1:]}} {
		if err := store.RecordDecisions(ctx, lease.Term, w.at, w.ds); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []lifecycle.WarmClaim{{Worker: "gone", At: t0.Add(-100 * time.Hour)}, {Worker: "live", At: t0.Add(-time.Hour)}} {
		if err := lw.RecordClaim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}

	clk := clock.NewFake(t0)
	held := &heldPrune{Store: store, entered: make(chan struct{}, 10), release: make(chan struct{})}
	lad := ladder.Defaults()
	ld := byhand.NewLead(leader.Status{Leading: true, Term: lease.Term, Since: t0.Add(-time.Hour)})
	loop := cycle.New(cycle.Config{Ladder: lad, Edition: ladder.EditionLite, Clock: clk},
		ld, store, store, &byhand.Static[sdk.Substrate]{V: idle{}}, nil)
	pruner := prune.NewAudit(prune.Config{Interval: lad.MaintenanceInterval, Retention: 72 * time.Hour, Clock: clk}, ld, held)
	pruner.TestSignals.Init(t)
	loop.TestSignals.Init(t)
	stopped := make(chan struct{}, 2)
	go func() { loop.Run(ctx); stopped <- struct{}{} }()
	go func() { pruner.Run(ctx); stopped <- struct{}{} }()
	if err := clk.BlockUntil(ctx, 2); err != nil { // the loop's and the prune's tickers are registered
		t.Fatal(err)
	}
	tick := func() time.Time {
		clk.Advance(lad.MaintenanceInterval)
		return clk.Now()
	}
	tick()
	<-held.entered // the first batch began with cycle 1; it is held
	// Three more cycles start, the last only once the two before it
	// ended: none waited for the held batch.
	tick()
	tick()
	last := tick()
	// Every cycle signals its start once it ended; the last tick's comes
	// (the wait fails the test if the cycles waited for the held batch).
	for started := (time.Time{}); !started.Equal(last); {
		started = loop.TestSignals.Cycled.WaitOrTimeout()
	}
	select {
	case <-held.entered:
		t.Fatal("a second batch began while the first was under way")
	default:
	}
	close(held.release)
	if term := pruner.TestSignals.Batch.WaitOrTimeout(); term != lease.Term {
		t.Fatalf("the batch ran under term %d, want %d", term, lease.Term)
	}

	recs, err := store.DecisionsFor(ctx, "r", "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Label != young[0].Label || recs[0].Evidence["liveness"] != "alive" || recs[1].Label != young[1].Label {
		t.Fatalf("explain reads %+v after the prune, want the two decisions within 72 h", recs)
	}
	pending, err := store.UnscoredDecisions(ctx, 0, 10)
	if err != nil || len(pending) != 1 || pending[0].ID != recs[1].ID {
		t.Fatalf("pending shadow decisions %+v (%v), want the one an hour old", pending, err)
	}
	var workers []string
	rows, err := pool.Query(ctx, "SELECT worker FROM warm_worker_claims ORDER BY worker")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	if len(workers) != 1 || workers[0] != "live" {
		t.Fatalf("warm workers' claims kept %v, want the live one only", workers)
	}
	cancel()
	<-stopped
	<-stopped
}
