package boardhistory_test

import (
	"context"
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
