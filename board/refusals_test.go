package board_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// refusalBoard is a board led by replica A under term, and A's store and
// writer, each telling obs.
func refusalBoard(t *testing.T) (*bundle, *board.Store, *lifecycle.Writer, *observer, int64) {
	t.Helper()
	ctx := context.Background()
	b := setup(t)
	obs := &observer{}
	a := board.New(b.pool, board.Options{Holder: "replica-a", Observer: obs})
	if _, err := a.Resign(ctx, 0, "test-leader"); err != nil {
		t.Fatal(err)
	}
	lease, ok, err := a.TryAcquire(ctx, "replica-a", leaseTTL, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("replica A acquires: ok=%v err=%v", ok, err)
	}
	w := lifecycle.New(b.pool, lifecycle.Options{Holder: "replica-a", Observer: obs}).Fenced(lease.Term)
	return b, a, w, obs, lease.Term
}

func refusals(t *testing.T, s *board.Store) []board.FenceRefusal {
	t.Helper()
	rs, err := s.FenceRefusals(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func markUnder(term int64, at time.Time, tasks ...string) []sdk.Mark {
	ms := make([]sdk.Mark, len(tasks))
	for i, task := range tasks {
		ms[i] = sdk.Mark{Attempt: first("run", task), FromStates: []string{sdk.StateRunning},
			HeartbeatBefore: base.Add(-90 * time.Second), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
			Message: "agent_lost: test", Term: term, At: at}
	}
	return ms
}

// A refused batch is one row: the write, the term and holder it claimed,
// its time, every attempt it named and the leader row it met (another
// term: stale by the term alone). Nothing of the batch is written, and the
// observer is told once.
func TestARefusedBatchIsOneRefusalRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, _, obs, term := refusalBoard(t)
	b.run(t, "run", "t1", "t2", "t3")
	for _, id := range []string{"t1", "t2", "t3"} {
		b.running(t, first("run", id), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
	}
	// Replica B took the next term.
	b.exec(t, `UPDATE leader SET term = term + 1, holder = 'replica-b'`)

	res, err := a.Mark(ctx, markUnder(term, base, "t1", "t2", "t3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Applied || r.NoopReason != sdk.NoopDeposed {
			t.Errorf("%s: %+v, want deposed", r.Attempt, r)
		}
	}
	for _, id := range []string{"t1", "t2", "t3"} {
		if got := b.ti(t, "run", id); got.State != sdk.StateRunning {
			t.Errorf("the refused batch wrote: %s is %s", id, got.State)
		}
	}
	rs := refusals(t, a)
	if len(rs) != 1 {
		t.Fatalf("refusal rows: %+v, want one for the batch", rs)
	}
	r := rs[0]
	want := []sdk.Attempt{first("run", "t1"), first("run", "t2"), first("run", "t3")}
	if r.Write != "mark" || r.Term != term || r.Holder != "replica-a" || !r.WriteAt.Equal(base) ||
		!slices.Equal(r.Attempts, want) || r.Requests != 3 {
		t.Errorf("the refusal: %+v", r)
	}
	if !r.LeadFound || r.LeadTerm != term+1 || r.LeadHolder != "replica-b" || r.Why() != board.RefusedTerm {
		t.Errorf("the leader row it met: %+v (%s), want term %d of replica-b (term)", r, r.Why(), term+1)
	}
	if r.At.IsZero() || time.Since(r.At) > time.Minute {
		t.Errorf("recorded at %s: the database's clock, now", r.At)
	}
	deposed, unrecorded := obs.fenced()
	if !slices.Equal(deposed, []string{fmt.Sprintf("mark %d", term)}) || len(unrecorded) != 0 {
		t.Errorf("told %v, unrecorded %v; want one deposed mark", deposed, unrecorded)
	}
}

// The same term number, another holder (a failover that lost the
// increment): every fenced path's refusal is recorded, stale by its
// holder; the rightful holder's writes record none.
func TestRefusalsOfAStaleHolderAreRecordedOnEveryPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, wa, obs, term := refusalBoard(t)
	b.run(t, "run", "t1", "t2")
	b.running(t, first("run", "t1"), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
	c := board.New(b.pool, board.Options{Holder: "replica-c"})
	b.exec(t, `UPDATE leader SET holder = 'replica-c'`)

	if err := a.AppendLog(ctx, term, []sdk.LogLine{
		{Attempt: first("run", "t1"), At: base, Line: "one"},
		{Attempt: first("run", "t1"), At: base.Add(time.Second), Line: "two"},
	}); !errors.Is(err, board.ErrDeposed) {
		t.Fatalf("A's try log: %v, want ErrDeposed", err)
	}
	if _, err := wa.Enqueue(ctx, first("run", "t2"), base); !errors.Is(err, lifecycle.ErrDeposed) {
		t.Fatalf("A's runner write: %v, want ErrDeposed", err)
	}
	if err := wa.Leads(ctx, base); !errors.Is(err, lifecycle.ErrDeposed) {
		t.Fatalf("A's fence check: %v, want ErrDeposed", err)
	}
	if _, err := a.PruneDecisions(ctx, term, base, base, 0); !errors.Is(err, board.ErrDeposed) {
		t.Fatalf("A's prune: %v, want ErrDeposed", err)
	}
	if res, err := a.ReapRun(ctx, sdk.RunReap{RunID: "run", OlderThan: base, At: base, Term: term}); err != nil || res.NoopReason != sdk.NoopDeposed {
		t.Fatalf("A's orphan reap: %+v %v, want deposed", res, err)
	}
	// C, the rightful holder, writes; nothing of it is a refusal.
	if err := c.AppendLog(ctx, term, []sdk.LogLine{{Attempt: first("run", "t1"), At: base, Line: "c"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PruneDecisions(ctx, term, base, base, 0); err != nil {
		t.Fatal(err)
	}

	rs := refusals(t, a)
	type got struct {
		write    string
		attempts []sdk.Attempt
		requests int
	}
	want := []got{
		{"append log", []sdk.Attempt{first("run", "t1")}, 1},
		{"enqueue", []sdk.Attempt{first("run", "t2")}, 1},
		{"fence check", nil, 0},
		{"prune decisions", nil, 0},
		{"reap run", []sdk.Attempt{{RunID: "run"}}, 1},
	}
	if len(rs) != len(want) {
		t.Fatalf("refusals: %+v, want %d", rs, len(want))
	}
	for i, r := range rs {
		w := want[i]
		if r.Write != w.write || !slices.Equal(r.Attempts, w.attempts) || r.Requests != w.requests {
			t.Errorf("refusal %d: %s %v (%d), want %s %v (%d)", i, r.Write, r.Attempts, r.Requests, w.write, w.attempts, w.requests)
		}
		if r.Term != term || r.Holder != "replica-a" || r.LeadTerm != term || r.LeadHolder != "replica-c" || r.Why() != board.RefusedHolder {
			t.Errorf("refusal %d (%s): %+v, why %s; want term %d of replica-a against replica-c's (holder)", i, r.Write, r, r.Why(), term)
		}
	}
	if deposed, _ := obs.fenced(); len(deposed) != len(want) {
		t.Errorf("the observer was told %v, want one per refused call", deposed)
	}
}

// A write past its own lease is refused for the lease, and a batch past
// MaxRefusalAttempts names the first of them and counts them all.
func TestARefusalPastTheLeaseAndABigBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, _, _, term := refusalBoard(t)
	n := board.MaxRefusalAttempts + 6
	tasks := make([]string, n)
	for i := range tasks {
		tasks[i] = id("t", i)
	}
	b.run(t, "run", tasks...)
	late := base.Add(2 * leaseTTL)
	res, err := a.Mark(ctx, markUnder(term, late, tasks...))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].NoopReason != sdk.NoopDeposed {
		t.Fatalf("a mark past the lease: %+v", res[0])
	}
	rs := refusals(t, a)
	if len(rs) != 1 {
		t.Fatalf("refusals: %+v", rs)
	}
	r := rs[0]
	if r.Why() != board.RefusedLease || !r.WriteAt.Equal(late) || r.LeadHolder != "replica-a" || r.LeadTerm != term {
		t.Errorf("the refusal: %+v, why %s, want lease", r, r.Why())
	}
	if len(r.Attempts) != board.MaxRefusalAttempts || r.Requests != n || r.Attempts[0] != first("run", tasks[0]) {
		t.Errorf("the refusal names %d attempts of %d (first %v), want %d of %d", len(r.Attempts), r.Requests,
			r.Attempts[0], board.MaxRefusalAttempts, n)
	}
	sum, err := a.RecentRefusals(ctx, time.Now().Add(-time.Hour))
	if err != nil || sum.Count != 1 || sum.Last == nil || sum.Last.ID != r.ID {
		t.Errorf("recent refusals: %+v %v", sum, err)
	}
	// The try log and a prune past the lease: what their fence saw is the
	// writer's own row, its lease run out.
	if err := a.AppendLog(ctx, term, []sdk.LogLine{{Attempt: first("run", tasks[0]), At: late, Line: "late"}}); !errors.Is(err, board.ErrDeposed) {
		t.Fatalf("a line past the lease: %v", err)
	}
	if _, err := a.PruneDecisions(ctx, term, late, base, 0); !errors.Is(err, board.ErrDeposed) {
		t.Fatalf("a prune past the lease: %v", err)
	}
	rs = refusals(t, a)
	if len(rs) != 3 {
		t.Fatalf("refusals: %+v", rs)
	}
	for _, r := range rs[1:] {
		if r.Why() != board.RefusedLease || !r.WriteAt.Equal(late) || r.LeadTerm != term || r.LeadHolder != "replica-a" ||
			!r.LeadExpiresAt.Equal(rs[0].LeadExpiresAt) {
			t.Errorf("%s past the lease: %+v, why %s", r.Write, r, r.Why())
		}
	}
	if sum, err := a.RecentRefusals(ctx, time.Now().Add(time.Hour)); err != nil || sum.Count != 0 || sum.Last != nil {
		t.Errorf("no refusal since: %+v %v", sum, err)
	}
}

// A refusal that cannot be recorded is told to the observer; the caller
// gets the refusal it would have got anyway.
func TestARefusalNotRecordedIsOnlyTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, _, obs, term := refusalBoard(t)
	b.run(t, "run", "t1")
	b.exec(t, `UPDATE leader SET holder = 'replica-c'`)
	b.exec(t, `ALTER TABLE fence_refusals RENAME TO fence_refusals_away`)
	err := a.AppendLog(ctx, term, []sdk.LogLine{{Attempt: first("run", "t1"), At: base, Line: "x"}})
	if !errors.Is(err, board.ErrDeposed) {
		t.Fatalf("append log: %v, want ErrDeposed", err)
	}
	deposed, unrecorded := obs.fenced()
	if len(deposed) != 1 || len(unrecorded) != 1 || !strings.Contains(unrecorded[0], "append log") {
		t.Errorf("told %v, unrecorded %v", deposed, unrecorded)
	}
}

// The refusals are kept to the audit's retention, by a prune fenced like
// the audit's.
func TestPruneRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, _, _, term := refusalBoard(t)
	b.run(t, "run", "t1")
	other := board.New(b.pool, board.Options{Holder: "replica-z"})
	for range 3 {
		if _, err := other.PruneDecisions(ctx, term, base, base, 0); !errors.Is(err, board.ErrDeposed) {
			t.Fatalf("a stranger's prune: %v", err)
		}
	}
	b.exec(t, `UPDATE fence_refusals SET at = at - interval '100 days' WHERE id IN (SELECT min(id) FROM fence_refusals)`)
	if _, err := other.PruneRefusals(ctx, term, base, time.Now().Add(-90*24*time.Hour), 0); !errors.Is(err, board.ErrDeposed) {
		t.Errorf("a stranger's prune of the refusals: %v, want ErrDeposed", err)
	}
	n, err := a.PruneRefusals(ctx, term, base, time.Now().Add(-90*24*time.Hour), 0)
	if err != nil || n != 1 {
		t.Errorf("the leader's prune: %d %v, want the one row past the retention", n, err)
	}
	if rs := refusals(t, a); len(rs) != 3 { // 3 kept, and the stranger's refused prune of the refusals
		t.Errorf("left: %d refusals, want 3", len(rs))
	}
}

// Every audit row names the replica that wrote it; a store without a
// holder writes none.
func TestTheAuditRecordsTheHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, a, _, _, term := refusalBoard(t)
	b.run(t, "run", "t1")
	d := sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: first("run", "t1"), Applied: true}
	if err := a.RecordDecisions(ctx, term, base, []sdk.Decision{d}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.RecordDecisions(ctx, term, base.Add(time.Second), []sdk.Decision{d}); err != nil {
		t.Fatal(err)
	}
	w := lifecycle.New(b.pool, lifecycle.Options{Holder: "replica-a"})
	b.exec(t, `UPDATE task_instances SET held_at = $1 WHERE run_id = 'run' AND task_id = 't1'`, base)
	if _, err := w.ReleaseHold(ctx, first("run", "t1"), "ops", base.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	recs, err := a.DecisionsFor(ctx, "run", "t1", 0)
	if err != nil {
		t.Fatal(err)
	}
	var holders []string
	for _, r := range recs {
		holders = append(holders, r.Label+":"+r.Holder)
	}
	want := []string{sdk.LabelAgentLost + ":replica-a", sdk.LabelAgentLost + ":", sdk.LabelOperatorRelease + ":replica-a"}
	if !slices.Equal(holders, want) {
		t.Errorf("the audit's holders: %v, want %v", holders, want)
	}
}
