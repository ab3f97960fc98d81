package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/cycle"
	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// metered is how many decisions m counted under label (not dry run).
func metered(t *testing.T, m *metrics.Metrics, label string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "dexaflow_scheduler_decisions_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			var vs []string
			for _, l := range s.GetLabel() {
				vs = append(vs, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(vs, " ") == "decision_type="+label+" dry_run=false" {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestRunnerAndAPIDecisionsAreRetried: the runner's and the attempt API's
// decisions go through the daemon's one decision pipeline: metered and
// logged at once, and when the database refuses their audit write (its
// audit table renamed away) they are no longer lost: the maintenance
// loop's next cycle writes them, each batch under the term it was decided
// under and at its time, though by then another replica leads under a new
// term and this one leads no more.
func TestRunnerAndAPIDecisionsAreRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	t0 := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	store := board.New(pool, board.Options{})
	el, err := leader.New(leaseStore{store}, leader.Config{Holder: "a", Lease: time.Minute, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	st := el.Step(ctx)
	if !st.Leading {
		t.Fatalf("status %+v, want leading", st)
	}
	var logs sdktest.LogBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
	m := metrics.New()
	d := &Daemon{opts: Options{Clock: clk}, log: log, store: store, elector: el, metrics: m,
		decisions: audit.NewPipeline(store, m, log.Named("audit"))}

	if _, err := pool.Exec(ctx, `ALTER TABLE reap_decisions RENAME TO reap_decisions_away`); err != nil {
		t.Fatalf("rename the audit away: %v", err)
	}
	ranAt := clk.Now()
	d.runnerDecisions(log.Named("runner"), st.Term, ranAt, []sdk.Decision{
		{Reaper: "runner", Label: sdk.LabelDispatchFailed, Attempt: sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1}, Applied: true},
		{Reaper: "runner", Label: sdk.LabelDispatchFailed, Attempt: sdk.Attempt{RunID: "r1", TaskID: "t2", Try: 1}, Applied: true},
	})
	clk.Advance(time.Second)
	apiAt := clk.Now()
	d.apiDecisions(ctx, []sdk.Decision{{Reaper: attemptapi.DecisionSource, Label: sdk.LabelExchangeNotFromPod,
		Attempt: sdk.Attempt{RunID: "r2", TaskID: "t1", Try: 1}}})
	if n := metered(t, m, sdk.LabelDispatchFailed); n != 2 {
		t.Fatalf("%v runner decisions metered, want 2 at once", n)
	}
	if n := metered(t, m, sdk.LabelExchangeNotFromPod); n != 1 {
		t.Fatalf("%v api decisions metered, want 1 at once", n)
	}
	if got := logs.String(); strings.Count(got, "audit of decisions failed: kept for the next cycle") != 2 ||
		!strings.Contains(got, "runner: decision:") || !strings.Contains(got, "attempt-api: decision:") {
		t.Fatalf("logs %s, want both producers' decisions and both failed writes", got)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE reap_decisions_away RENAME TO reap_decisions`); err != nil {
		t.Fatalf("rename the audit back: %v", err)
	}

	// Another replica takes over once this one's lease ran out.
	clk.Advance(2 * time.Minute)
	next, ok, err := store.TryAcquire(ctx, "b", time.Minute, clk.Now())
	if err != nil || !ok || next.Term == st.Term {
		t.Fatalf("a new leader: %+v %v %v", next, ok, err)
	}
	loop := cycle.New(cycle.Config{Clock: clk, Metrics: m, Logger: log.Named("cycle"), Decisions: d.decisions},
		el, store, store, nil, nil)
	if res := loop.RunOnce(ctx); res.Leading {
		t.Fatalf("cycle %+v, want this replica not leading", res)
	}
	for _, c := range []struct {
		at   time.Time
		want int
	}{{ranAt, 2}, {apiAt, 1}} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM reap_decisions WHERE term = $1 AND at = $2`,
			st.Term, c.at).Scan(&n); err != nil || n != c.want {
			t.Fatalf("%d rows under term %d at %s (err %v), want %d", n, st.Term, c.at, err, c.want)
		}
	}
	var later int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM reap_decisions WHERE term <> $1`, st.Term).Scan(&later); err != nil || later != 0 {
		t.Fatalf("%d rows under another term (err %v), want none", later, err)
	}
	if n := metered(t, m, sdk.LabelDispatchFailed); n != 2 {
		t.Fatalf("%v runner decisions metered after the retry, want still 2", n)
	}
}
