package board_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/history"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// failoverPool is the pool reaperd would open on dsn: board.ParseDSN, then
// pgxpool.NewWithConfig.
func failoverPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := board.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// serverPort is the port of the server that answers a call on pool, and
// whether it is a primary.
func serverPort(ctx context.Context, pool *pgxpool.Pool) (port int, primary bool, err error) {
	err = pool.QueryRow(ctx, "SELECT inet_server_port(), NOT pg_is_in_recovery()").Scan(&port, &primary)
	return port, primary, err
}

// TestMultiHostDSNFollowsAPromotion: a pool opened as reaperd opens it, on
// a DSN naming the primary and its standby with
// target_session_attrs=read-write, reaches the primary while it lives
// (whichever server the DSN names first), says why it cannot write while
// no server is primary, and once the standby is promoted makes its new
// connections there, without being opened again.
func TestMultiHostDSNFollowsAPromotion(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pool := failoverPool(t, pgtest.FailoverDSN("board", primary, standby))
	standbyFirst := failoverPool(t, pgtest.FailoverDSN("board", standby, primary))
	for name, p := range map[string]*pgxpool.Pool{"primary first": pool, "standby first": standbyFirst} {
		if port, isPrimary, err := serverPort(ctx, p); err != nil || port != primary.Port() || !isPrimary {
			t.Fatalf("%s: the pool reached port %d (primary %v, err %v), want the primary's %d", name, port, isPrimary, err,
				primary.Port())
		}
	}
	store := board.New(pool, board.Options{})
	if _, ok, err := store.TryAcquire(ctx, "A", leaseTTL, base); err != nil || !ok {
		t.Fatalf("acquire on the primary: ok=%v err=%v", ok, err)
	}
	// Several connections open on the primary, as a replica's pool holds.
	var held []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}

	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	// No primary: a new connection finds only the standby, and says so.
	fresh := failoverPool(t, pgtest.FailoverDSN("board", primary, standby))
	err := fresh.Ping(ctx)
	if err == nil {
		t.Fatal("a connection was made while no server accepts writes")
	}
	if got := board.ConnProblem(err); !strings.Contains(got, "no server of the DSN accepts writes") {
		t.Fatalf("ConnProblem with the primary dead and the standby not promoted = %q (%v)", got, err)
	}

	began := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// The pool's connections to the dead primary fail their next call
	// and are dropped; new ones reach the promoted standby.
	var failed int
	for {
		l, ok, err := store.CurrentLeader(ctx)
		if err == nil {
			if !ok || l.Holder != "A" {
				t.Fatalf("leader on the promoted standby = %+v (found %v), want A's: the standby was synchronous", l, ok)
			}
			break
		}
		if failed++; ctx.Err() != nil || failed > 100 {
			t.Fatalf("the pool never reached the promoted standby (%d calls failed): %v", failed, err)
		}
	}
	t.Logf("promotion %v; %d calls failed on the dead primary's connections, then the pool answered from the new primary %v after the promotion",
		promoted.Sub(began).Round(time.Millisecond), failed, time.Since(promoted).Round(time.Millisecond))
	for range 8 { // every connection now: none is left on the dead server
		if port, isPrimary, err := serverPort(ctx, pool); err != nil || port != standby.Port() || !isPrimary {
			t.Fatalf("after the promotion the pool reached port %d (primary %v, err %v), want the promoted standby's %d",
				port, isPrimary, err, standby.Port())
		}
	}
	if _, ok, err := store.Renew(ctx, 1, "A", leaseTTL, base.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("renew on the promoted standby: ok=%v err=%v", ok, err)
	}
}

// TestMultiHostDSNPassesAStalledPrimary: when the old primary hangs rather
// than refuses (its processes stopped, as by a frozen disk) and the standby
// is promoted, a connection through a multi-host DSN that gives no
// connect_timeout gives up on the stalled server after
// board.ConnectTimeoutMultiHostDefault and reaches the promoted standby,
// within a call's bound; without that default it would wait on the stalled
// server for the whole bound.
func TestMultiHostDSNPassesAStalledPrimary(t *testing.T) {
	t.Parallel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := primary.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.FailoverDSN("board", primary, standby)
	bound := 2 * board.ConnectTimeoutMultiHostDefault

	pool := failoverPool(t, dsn)
	call, cancelCall := context.WithTimeout(ctx, bound)
	defer cancelCall()
	began := time.Now()
	if port, isPrimary, err := serverPort(call, pool); err != nil || port != standby.Port() || !isPrimary {
		t.Fatalf("with the primary stalled the pool reached port %d (primary %v, err %v), want the promoted standby's %d",
			port, isPrimary, err, standby.Port())
	}
	t.Logf("reached the promoted standby past the stalled primary in %v", time.Since(began).Round(time.Millisecond))

	// The same DSN parsed without the default: the stalled server takes
	// the whole bound.
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	call2, cancelCall2 := context.WithTimeout(ctx, bound)
	defer cancelCall2()
	if conn, err := pgx.ConnectConfig(call2, cfg); err == nil {
		conn.Close(ctx)
		t.Fatal("without a connect timeout, a connection passed the stalled primary: the test proves nothing")
	}
}

// TestFollowPrimary: ParseDSN fits a DSN naming more than one server to a
// failover (only a server accepting writes, a connect timeout per server)
// and leaves one naming a single server as pgx parses it, its TLS fallback
// of sslmode=prefer included.
func TestFollowPrimary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dsn  string
		readWrite  bool
		timeout    time.Duration
		validation bool // any ValidateConnect
	}{
		{"OneServer", "host=db port=5432 dbname=board", false, 0, false},
		{"OneServerURL", "postgres://u@db:5432/board?sslmode=prefer", false, 0, false},
		{"OneServerTwice", "host=db,db port=5432,5432 dbname=board", false, 0, false},
		{"TwoServers", "host=a,b port=5432,5433 dbname=board", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersURL", "postgres://u@a:5432,b:5433/board", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersAny", "host=a,b dbname=board target_session_attrs=any", true, board.ConnectTimeoutMultiHostDefault, true},
		{"TwoServersOwnTimeout", "host=a,b dbname=board target_session_attrs=read-write connect_timeout=7", true, 7 * time.Second, true},
		{"TwoServersPrimary", "host=a,b dbname=board target_session_attrs=primary", false, board.ConnectTimeoutMultiHostDefault, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := board.ParseDSN(tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			cc := cfg.ConnConfig
			if got := cc.ConnectTimeout; got != tc.timeout {
				t.Errorf("connect timeout = %v, want %v", got, tc.timeout)
			}
			if got := cc.ValidateConnect != nil; got != tc.validation {
				t.Fatalf("a connection validated: %v, want %v", got, tc.validation)
			}
			if got := fmt.Sprintf("%p", cc.ValidateConnect) == fmt.Sprintf("%p", pgconn.ValidateConnectTargetSessionAttrsReadWrite); tc.validation && got != tc.readWrite {
				t.Errorf("read-write validation: %v, want %v", got, tc.readWrite)
			}
		})
	}
}

// TestFailoverToAnAsyncStandbyThatLostATermIncrementDoesNotHandTheTermTwice:
// three replicas, each with its own pool on a DSN naming a real primary and
// its real streaming standby. A leads under term N; the standby is made to
// miss everything after that; B takes over (N+1, A's lease run out) and
// marks a task. The primary is killed and the standby promoted: B's term
// and B's mark are gone, and C, acquiring there, is handed N+1 again. B,
// still believing it holds N+1, writes: the fence, which checks the
// holder, refuses B's mark and B's runner write; C's apply. A store fenced
// by the term alone would have let B's write through, and that is shown
// too. With a synchronous standby nothing is lost: B keeps its lease
// across the failover, C gets N+2 once it runs out, and B is refused by
// the term.
func TestFailoverToAnAsyncStandbyThatLostATermIncrementDoesNotHandTheTermTwice(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		name := "Asynchronous"
		if sync {
			name = "Synchronous"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			failoverFence(t, sync)
		})
	}
}

func failoverFence(t *testing.T, sync bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, standby := pgtest.NewFailoverPair(t, "board", pgtest.StandbyOptions{Synchronous: sync})
	dsn := pgtest.FailoverDSN("board", primary, standby)
	type replica struct {
		name  string
		store *board.Store
		w     *lifecycle.Writer
	}
	newReplica := func(name string) replica {
		pool := failoverPool(t, dsn)
		return replica{name, board.New(pool, board.Options{Holder: name}), lifecycle.New(pool, lifecycle.Options{Holder: name})}
	}
	a, b, c := newReplica("A"), newReplica("B"), newReplica("C")

	// The board: one run, t1, t2 and t4 running (their agents silent for
	// ten minutes before t0), t3 not started. Written before anyone leads,
	// unfenced.
	t0 := base
	setupPool := failoverPool(t, dsn)
	rows := &bundle{pool: setupPool, store: board.New(setupPool, board.Options{}), w: lifecycle.New(setupPool, lifecycle.Options{})}
	rows.run(t, "run", "t1", "t2", "t3", "t4")
	for _, id := range []string{"t1", "t2", "t4"} {
		rows.running(t, first("run", id), t0.Add(-20*time.Minute), t0.Add(-10*time.Minute))
	}
	mark := func(task string, term int64, at time.Time) sdk.Mark {
		return sdk.Mark{Attempt: first("run", task), FromStates: []string{sdk.StateRunning},
			HeartbeatBefore: at.Add(-90 * time.Second), Kind: sdk.MarkInfra, Reason: sdk.LabelAgentLost,
			Message: "agent_lost: failover test", Term: term, At: at}
	}
	// markThrough marks through store, once its pool has dropped the
	// connections the dead primary left it (each fails one call).
	markThrough := func(store *board.Store, m sdk.Mark) sdk.MarkResult {
		t.Helper()
		for failed := 0; ; failed++ {
			res, err := store.Mark(ctx, []sdk.Mark{m})
			if err == nil {
				return res[0]
			}
			if failed == 20 || ctx.Err() != nil {
				t.Fatalf("mark %s: %v", m.Attempt, err)
			}
		}
	}

	// A leads under term N, and the standby has it.
	leaseA, ok, err := a.store.TryAcquire(ctx, "A", leaseTTL, t0)
	if err != nil || !ok {
		t.Fatalf("A acquires: ok=%v err=%v", ok, err)
	}
	n := leaseA.Term
	if err := standby.WaitCaughtUp(ctx, primary); err != nil {
		t.Fatal(err)
	}
	if !sync {
		// The standby falls behind: nothing after this reaches it.
		if err := standby.StopStreaming(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A's lease runs out; B takes over under N+1 and marks t1.
	tB := t0.Add(leaseTTL + time.Second)
	leaseB, ok, err := b.store.TryAcquire(ctx, "B", leaseTTL, tB)
	if err != nil || !ok || leaseB.Term != n+1 {
		t.Fatalf("B acquires after A's lease: %+v ok=%v err=%v, want term %d", leaseB, ok, err, n+1)
	}
	if r := markThrough(b.store, mark("t1", n+1, tB.Add(time.Second))); !r.Applied {
		t.Fatalf("B's mark of t1 on the primary: %+v, want applied", r)
	}

	// The primary dies; the standby is promoted.
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	// C acquires on the promoted standby, as soon as it sees no lease
	// held.
	tC := tB.Add(2 * time.Second)
	leaseC, ok, err := c.store.TryAcquire(ctx, "C", leaseTTL, tC)
	if err != nil {
		t.Fatal(err)
	}
	t1 := readTI(t, ctx, c.store, "t1")
	if !sync {
		// The failover lost B's term and B's mark: C is handed N+1 again.
		if !ok || leaseC.Term != n+1 || leaseC.Holder != "C" {
			t.Fatalf("C acquires on the promoted standby: %+v ok=%v, want term %d reissued to C", leaseC, ok, n+1)
		}
		if t1.State != sdk.StateRunning {
			t.Fatalf("t1 on the promoted standby is %s, want running: B's mark was acknowledged after the standby stopped streaming", t1.State)
		}
	} else {
		// Nothing lost: B still holds N+1, and t1 is marked.
		if ok || leaseC.Term != n+1 || leaseC.Holder != "B" {
			t.Fatalf("C acquires while B's lease runs: %+v ok=%v, want B's term %d kept", leaseC, ok, n+1)
		}
		if t1.State != sdk.StateFailed {
			t.Fatalf("t1 on the promoted standby is %s, want failed: B's mark was acknowledged by a synchronous standby", t1.State)
		}
		tC = tB.Add(leaseTTL + time.Second)
		if leaseC, ok, err = c.store.TryAcquire(ctx, "C", leaseTTL, tC); err != nil || !ok || leaseC.Term != n+2 {
			t.Fatalf("C acquires after B's lease: %+v ok=%v err=%v, want term %d", leaseC, ok, err, n+2)
		}
	}
	t.Logf("A held %d; B took %d on the primary; C took %d on the promoted standby", n, leaseB.Term, leaseC.Term)

	// B, still within the lease it believes it holds under N+1, writes.
	atB := tB.Add(3 * time.Second)
	if r := markThrough(b.store, mark("t2", n+1, atB)); r.Applied || r.NoopReason != sdk.NoopDeposed {
		t.Errorf("B's mark of t2 under the term C holds: %+v, want deposed", r)
	}
	if got := readTI(t, ctx, c.store, "t2"); got.State != sdk.StateRunning {
		t.Errorf("B's deposed mark wrote: t2 is %s", got.State)
	}
	if ok, err := b.w.Fenced(n+1).Enqueue(ctx, first("run", "t3"), atB); !errors.Is(err, lifecycle.ErrDeposed) {
		t.Errorf("B's runner write: ok=%v err=%v, want lifecycle.ErrDeposed", ok, err)
	} else {
		t.Logf("B's runner write: %v", err)
	}
	// C writes the same rows.
	atC := tC.Add(time.Second)
	if r := markThrough(c.store, mark("t2", leaseC.Term, atC)); !r.Applied {
		t.Errorf("C's mark of t2: %+v, want applied", r)
	}
	if ok, err := c.w.Fenced(leaseC.Term).Enqueue(ctx, first("run", "t3"), atC); err != nil || !ok {
		t.Errorf("C's runner write: ok=%v err=%v, want applied", ok, err)
	}

	// The history of the board that survived, for the checker: C's term,
	// B's write after the failover (refused) and C's (applied). What the
	// failover lost (B's term and mark on the old primary) is not on this
	// board, and is the asynchronous standby's known loss, not a writer's.
	outcome := func(applied bool, reason string) string {
		if applied {
			return history.OutcomeApplied
		}
		return reason
	}
	at := func(a sdk.Attempt) *history.Attempt {
		return &history.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch}
	}
	rB := markThrough(b.store, mark("t4", n+1, atB.Add(time.Millisecond)))
	events := []history.Event{
		{Time: tC, Kind: history.KindWrite, Op: "acquire", Term: leaseC.Term, Holder: "C", Outcome: history.OutcomeApplied},
		{Time: atB.Add(time.Millisecond), Kind: history.KindWrite, Op: "mark", Term: n + 1, Holder: "B",
			Attempt: at(first("run", "t4")), State: sdk.StateFailed, Outcome: outcome(rB.Applied, rB.NoopReason)},
		{Time: atC, Kind: history.KindWrite, Op: "mark", Term: leaseC.Term, Holder: "C",
			Attempt: at(first("run", "t2")), State: sdk.StateFailed, Outcome: history.OutcomeApplied},
	}
	if v := writers(history.Check(events)); len(v) != 0 {
		t.Errorf("the checker finds two writers with the holder fence: %v", v)
	}

	// The fence as it was, on the term alone: after an asynchronous
	// failover B's write passes it beside C's, and the checker says so.
	termOnly := board.New(b.store.Pool(), board.Options{})
	r := markThrough(termOnly, mark("t4", n+1, atB.Add(2*time.Millisecond)))
	if r.Applied == sync {
		t.Errorf("B's mark of t4 through a fence on the term alone: %+v, want applied=%v", r, !sync)
	}
	events = append(events, history.Event{Time: atB.Add(2 * time.Millisecond), Kind: history.KindWrite, Op: "mark",
		Term: n + 1, Holder: "B", Attempt: at(first("run", "t4")), State: sdk.StateFailed, Outcome: outcome(r.Applied, r.NoopReason)})
	found := writers(history.Check(events))
	if !sync && len(found) == 0 {
		t.Errorf("the checker found no second writer though B's write under the reissued term applied")
	}
	if sync && len(found) != 0 {
		t.Errorf("the checker finds two writers after a synchronous failover: %v", found)
	}
	for _, v := range found {
		t.Logf("through a fence on the term alone: %s", v)
	}
}

// writers is the verdict's violations of the one-writer rules.
func writers(v history.Verdict) []history.Violation {
	var out []history.Violation
	for _, x := range v.Violations {
		if x.Rule == history.RuleTermTwice || x.Rule == history.RuleStaleTerm {
			out = append(out, x)
		}
	}
	return out
}

func readTI(t *testing.T, ctx context.Context, store *board.Store, task string) board.TaskInstance {
	t.Helper()
	for failed := 0; ; failed++ {
		ti, err := store.TaskInstance(ctx, "run", task)
		if err == nil {
			return ti
		}
		if failed == 20 || ctx.Err() != nil {
			t.Fatalf("read %s: %v", task, err)
		}
	}
}
