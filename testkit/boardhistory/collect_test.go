package boardhistory_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
	"github.com/dexaflow/reaper/testkit/history"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Install on a real board, write the way reaperd does (a named connection;
// a fenced transaction share-locks the leader row), Collect, Record, Check.
func TestInstallAndCollect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewDB(t)
	if err := boardhistory.Install(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const holder = "host/4242/0a1b2c3d"
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(ctx, holder, time.Minute, time.Now())
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := lifecycle.New(pool, lifecycle.Options{}).CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "d",
		State: sdk.RunRunning, Tasks: []lifecycle.NewTask{{TaskID: "a", Executor: sdk.ExecutorLite, Command: "true"}}},
		time.Now()); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(pgtest.DSN(pool))
	if err != nil {
		t.Fatal(err)
	}
	board.NameConnections(cfg, holder)
	named, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	// A fenced write: the leader row share-locked in its transaction.
	tx, err := named.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT term FROM leader FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE task_instances SET state = 'queued' WHERE run_id = 'r' AND task_id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Unfenced: an agent's report and its heartbeat.
	for _, q := range []string{
		`UPDATE task_instances SET state = 'running' WHERE run_id = 'r' AND task_id = 'a'`,
		`UPDATE task_instances SET last_heartbeat_at = now() WHERE run_id = 'r' AND task_id = 'a'`,
		`UPDATE task_instances SET state = 'success' WHERE run_id = 'r' AND task_id = 'a'`,
		`UPDATE runs SET state = 'success' WHERE run_id = 'r'`,
	} {
		if _, err := named.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	b, err := boardhistory.Collect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Terms) != 1 || b.Terms[0].Term != lease.Term || b.Terms[0].Holder != holder {
		t.Errorf("terms: %+v", b.Terms)
	}
	if len(b.Transitions) != 3 {
		t.Fatalf("transitions: %+v", b.Transitions)
	}
	if tr := b.Transitions[0]; !tr.Fenced || tr.Writer != holder || tr.NewState != sdk.StateQueued || tr.Term != lease.Term ||
		tr.LeadHolder != holder || tr.From != (sdk.Attempt{RunID: "r", TaskID: "a", Try: 1, Epoch: 0}) || tr.To != tr.From {
		t.Errorf("the fenced write: %+v", tr)
	}
	if tr := b.Transitions[1]; tr.Fenced || tr.NewState != sdk.StateRunning {
		t.Errorf("the unfenced write: %+v", tr)
	}
	if len(b.RunChanges) != 1 || b.RunChanges[0].NewState != sdk.RunSuccess || b.RunChanges[0].Fenced {
		t.Errorf("run changes: %+v", b.RunChanges)
	}
	if n := len(b.Heartbeats[sdk.Attempt{RunID: "r", TaskID: "a", Try: 1}]); n != 1 {
		t.Errorf("heartbeats: %+v", b.Heartbeats)
	}
	finals, err := boardhistory.ReadFinals(ctx, pool, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(finals) != 1 || finals[0].State != sdk.StateSuccess {
		t.Errorf("finals: %+v", finals)
	}
	v := history.Check(boardhistory.Record(b, nil, nil, finals))
	if !v.OK() || v.WritesApplied != 6 || v.Terms != 1 {
		t.Errorf("verdict: %s", v)
	}
}

// A write the fence refused on a real board is collected and becomes a
// refused write of the history, with what the fence met: A's mark after B
// took the next term (stale by its term) and B's after its own lease ran
// out (the lease's refusal, not the rightful holder's) both leave the
// history clean.
func TestRefusalsAreCollected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.NewDB(t)
	if err := boardhistory.Install(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const holderA, holderB = "host/1/aaaa", "host/2/bbbb"
	a := board.New(pool, board.Options{Holder: holderA})
	b := board.New(pool, board.Options{Holder: holderB})
	t0 := time.Now()
	leaseA, ok, err := a.TryAcquire(ctx, holderA, time.Second, t0)
	if err != nil || !ok {
		t.Fatalf("A acquires: %v %v", ok, err)
	}
	if err := lifecycle.New(pool, lifecycle.Options{}).CreateRun(ctx, lifecycle.NewRun{RunID: "r", DagID: "d",
		State: sdk.RunRunning, Tasks: []lifecycle.NewTask{{TaskID: "a", Executor: sdk.ExecutorLite, Command: "true"}}},
		t0); err != nil {
		t.Fatal(err)
	}
	leaseB, ok, err := b.TryAcquire(ctx, holderB, time.Second, t0.Add(2*time.Second))
	if err != nil || !ok || leaseB.Term != leaseA.Term+1 {
		t.Fatalf("B acquires: %+v %v %v", leaseB, ok, err)
	}
	a1 := sdk.Attempt{RunID: "r", TaskID: "a", Try: 1}
	mark := func(term int64, at time.Time) sdk.Mark {
		return sdk.Mark{Attempt: a1, FromStates: []string{sdk.StateNone}, HeartbeatBefore: at, Kind: sdk.MarkInfra,
			Reason: sdk.LabelAgentLost, Message: "agent_lost: test", Term: term, At: at}
	}
	for _, try := range []struct {
		who  *board.Store
		mark sdk.Mark
	}{
		{a, mark(leaseA.Term, t0.Add(2*time.Second))},
		{b, mark(leaseB.Term, t0.Add(5*time.Second))}, // past B's own lease
	} {
		if res, err := try.who.Mark(ctx, []sdk.Mark{try.mark}); err != nil || res[0].NoopReason != sdk.NoopDeposed {
			t.Fatalf("mark under term %d: %+v %v, want deposed", try.mark.Term, res, err)
		}
	}
	// The run ends by an operator's hand, so the history has a final row.
	if _, err := pool.Exec(ctx, `UPDATE task_instances SET state = 'success'`); err != nil {
		t.Fatal(err)
	}

	col, err := boardhistory.Collect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(col.Refusals) != 2 || col.Refusals[0].Why() != board.RefusedTerm || col.Refusals[1].Why() != board.RefusedLease {
		t.Fatalf("refusals: %+v", col.Refusals)
	}
	finals, err := boardhistory.ReadFinals(ctx, pool, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "history.jsonl")
	v, err := boardhistory.Judge(path, boardhistory.Record(col, nil, nil, finals))
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK() || v.RefusedByFence != 2 || v.Terms != 2 {
		t.Fatalf("verdict: %s", v)
	}
	read, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(read, func(e history.Event) bool { return e.Outcome == history.OutcomeDeposed })
	if e := read[i]; e.Op != "mark" || e.Term != leaseA.Term || e.Holder != holderA || e.Attempt == nil ||
		e.Attempt.TaskID != "a" || e.Fence == nil || e.Fence.Term != leaseB.Term || e.Fence.Holder != holderB {
		t.Errorf("A's refusal in the file: %+v %+v", e, e.Fence)
	}
}
