package audit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// counted is a Meter that counts the decisions it is given, by label.
type counted struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counted) Decision(d sdk.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[d.Label]++
}

func (c *counted) of(label string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[label]
}

// rows counts the audit rows under term at at.
func rows(ctx context.Context, t *testing.T, pool *pgxpool.Pool, term int64, at time.Time) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reap_decisions WHERE term = $1 AND at = $2`, term, at).Scan(&n); err != nil {
		t.Fatalf("count audit rows: %v", err)
	}
	return n
}

// TestPipeline_RefusedWriteIsRetriedUnderItsTerm: a batch whose write the
// database refuses (its audit table renamed away) is metered and logged at
// once, kept, and written at the next Retry once the table is back, under
// the term and at the time it was decided, though another term leads by
// then.
func TestPipeline_RefusedWriteIsRetriedUnderItsTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	old, ok, err := store.TryAcquire(ctx, "old", time.Minute, t0)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	var logs sdktest.LogBuffer
	meter := &counted{}
	p := audit.NewPipeline(store, meter, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))

	if _, err := pool.Exec(ctx, `ALTER TABLE reap_decisions RENAME TO reap_decisions_away`); err != nil {
		t.Fatalf("rename the audit away: %v", err)
	}
	ds := decisions(0, 3) // applied: logged at INFO
	if out := p.Record(ctx, old.Term, t0, ds); out.Written != 0 || out.Pending != 3 || out.Err == nil {
		t.Fatalf("record with the audit away: %+v, want 3 pending and the error", out)
	}
	if n := meter.of(ds[0].Label); n != 3 {
		t.Fatalf("%d metered, want the 3 at once", n)
	}
	if !strings.Contains(logs.String(), "audit of decisions failed: kept for the next cycle") ||
		strings.Count(logs.String(), "[INFO]  decision:") != 3 {
		t.Fatalf("logs %s, want the 3 decisions and the failed write", logs.String())
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE reap_decisions_away RENAME TO reap_decisions`); err != nil {
		t.Fatalf("rename the audit back: %v", err)
	}
	next, ok, err := store.TryAcquire(ctx, "new", time.Minute, t0.Add(2*time.Minute))
	if err != nil || !ok || next.Term == old.Term {
		t.Fatalf("a new leader: %+v %v %v", next, ok, err)
	}
	if out := p.Retry(ctx); out != (audit.Outcome{Written: 3}) {
		t.Fatalf("retry %+v, want the 3 written", out)
	}
	if n := rows(ctx, t, pool, old.Term, t0); n != 3 {
		t.Fatalf("%d rows under the term that decided them, want 3", n)
	}
	if n := meter.of(ds[0].Label); n != 3 {
		t.Fatalf("%d metered after the retry, want 3: a retry is not metered again", n)
	}
}

// TestPipeline_PassWiresSinkAndLedger: a pass's sink covers its ledger as
// its batches are written (no write it decided is audited again by the
// host), meters them through the pipeline, keeps the first Keep for its
// caller and counts them all; a refusal after the pass was closed is
// recorded by the pipeline.
func TestPipeline_PassWiresSinkAndLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := &scripted{}
	meter := &counted{}
	p := audit.NewPipeline(g, meter, nil)
	pass := p.NewPass(ctx, applying{}, audit.PassSpec{Term: 7, At: t0, Name: "agentlost", Keep: 2})
	ds := decisions(0, 3)
	var marks []sdk.Mark
	for i := range ds {
		marks = append(marks, sdk.Mark{Attempt: ds[i].Attempt, Kind: sdk.MarkInfra, Reason: ds[i].Label})
	}
	if _, err := pass.Ledger.Mark(ctx, marks); err != nil {
		t.Fatalf("mark: %v", err)
	}
	if err := pass.Sink.Record(ctx, ds); err != nil {
		t.Fatalf("record: %v", err)
	}
	if out := pass.Finish(); out.Written != 3 || out.Pending != 0 {
		t.Fatalf("finish %+v, want the 3 written", out)
	}
	if lost := pass.Ledger.Unaudited("agentlost", nil, "test"); len(lost) != 0 {
		t.Fatalf("unaudited %+v, want none: the sink covered the ledger", lost)
	}
	kept, n := pass.Decisions()
	if n != 3 || !sameAttempts(kept, ds[:2]) {
		t.Fatalf("pass decisions %d %+v, want the first 2 of 3", n, kept)
	}
	if got := meter.of(ds[0].Label); got != 3 {
		t.Fatalf("%d metered, want 3", got)
	}
	if _, err := pass.Ledger.Mark(ctx, marks[:1]); err == nil {
		t.Fatal("a mark after the pass was closed was taken")
	}
	if got := meter.of(sdk.LabelBoardRefusedPassClosed); got != 1 {
		t.Fatalf("%d late refusals metered, want 1", got)
	}
	w := g.asked()
	if last := w[len(w)-1]; last.term != 7 || !last.at.Equal(t0) || len(last.ds) != 1 ||
		last.ds[0].Reaper != "agentlost" || last.ds[0].Label != sdk.LabelBoardRefusedPassClosed {
		t.Fatalf("late refusal written as %+v, want under the pass's term and time, filed under its plugin", last)
	}
}
