package reapers_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/internal/pgtest"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// benchNow is the pass time of every benchmark; the seeded rows are placed
// relative to it.
var benchNow = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

// tasksPerRun is how many task instances each seeded run holds.
const tasksPerRun = 10

// benchBoard is a fresh board with a current leadership term whose lease
// covers every pass of a benchmark.
type benchBoard struct {
	pool  *pgxpool.Pool
	store *board.Store
	term  int64
}

func newBenchBoard(b *testing.B) *benchBoard {
	b.Helper()
	pool := pgtest.NewDB(b)
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(context.Background(), "bench", 24*time.Hour, benchNow.Add(-time.Hour))
	if err != nil || !ok {
		b.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	return &benchBoard{pool: pool, store: store, term: lease.Term}
}

func (bb *benchBoard) exec(b *testing.B, sql string, args ...any) {
	b.Helper()
	if _, err := bb.pool.Exec(context.Background(), sql, args...); err != nil {
		b.Fatalf("%s: %v", sql, err)
	}
}

// seedRunning inserts n running Lite attempts, tasksPerRun to a run, in
// two statements. The attempts entered running between 50 and 10 minutes
// before benchNow; each last heartbeated heartbeatAgo (plus up to a second,
// spread over the rows) before it.
func (bb *benchBoard) seedRunning(b *testing.B, n int, heartbeatAgo time.Duration) {
	b.Helper()
	bb.exec(b, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
        SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 hour', $1
        FROM generate_series(0, $2::int - 1) r`, benchNow, (n+tasksPerRun-1)/tasksPerRun)
	bb.exec(b, `INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at,
            last_heartbeat_at, updated_at)
        SELECT 'run' || lpad((i / $4::int)::text, 6, '0'), 'task' || lpad((i % $4::int)::text, 2, '0'), 'lite', 'running',
            $1::timestamptz - interval '51 minutes' + (i % 2400) * interval '1 second',
            $1::timestamptz - interval '50 minutes' + (i % 2400) * interval '1 second',
            $1::timestamptz - $3::interval - (i % 1000) * interval '1 millisecond', $1
        FROM generate_series(0, $2::int - 1) i`, benchNow, n, heartbeatAgo, tasksPerRun)
	bb.exec(b, "VACUUM ANALYZE runs, task_instances")
}

// attempts lists the seeded attempts.
func seededAttempts(n int) []sdk.Attempt {
	out := make([]sdk.Attempt, n)
	for i := range out {
		out[i] = sdk.Attempt{RunID: fmt.Sprintf("run%06d", i/tasksPerRun), TaskID: fmt.Sprintf("task%02d", i%tasksPerRun), Try: 1}
	}
	return out
}

// liteSubstrate is the Lite substrate in-process over a new record
// directory.
func liteSubstrate(b *testing.B) (*lite.Substrate, string) {
	b.Helper()
	dir := filepath.Join(b.TempDir(), "records")
	sub := lite.New(hclog.NewNullLogger())
	if err := sub.Configure(context.Background(), sdk.ConfigureRequest{Edition: ladder.EditionLite,
		Values: sdk.Values{lite.AttrRecordDir: dir}, Ladder: ladder.Defaults()}); err != nil {
		b.Fatal(err)
	}
	return sub, dir
}

// deadProcesses returns n processes that have exited and been reaped, with
// the start times they had.
func deadProcesses(b *testing.B, n int) []proc.Info {
	b.Helper()
	out := make([]proc.Info, 0, n)
	for range n {
		cmd := exec.Command("cat")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		info, err := proc.Stat(cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		out = append(out, info)
	}
	return out
}

// recordDead writes, for every attempt, the records a killed agent leaves
// behind: its .pid record and its task's .pgid record, naming processes
// that have exited.
func recordDead(b *testing.B, dir *records.Dir, attempts []sdk.Attempt) {
	b.Helper()
	boot, _ := proc.BootID()
	dead := deadProcesses(b, 16)
	for i, a := range attempts {
		agentProc, leader := dead[i%len(dead)], dead[(i+1)%len(dead)]
		if err := dir.WriteAgent(records.AgentRecord{Attempt: a, PID: agentProc.PID, Start: agentProc.Start, Boot: boot}); err != nil {
			b.Fatal(err)
		}
		if err := dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: leader.PID, AgentPID: agentProc.PID,
			AgentStart: agentProc.Start, LeaderStart: leader.Start, Boot: boot}); err != nil {
			b.Fatal(err)
		}
	}
}

// massRecovery is the data of the mass-recovery benchmark: massAttempts
// running Lite attempts, silent for ten minutes, every agent and task group
// gone (their records name exited processes).
const massAttempts = 10_000

// resetMass puts every attempt back to running, unmarked, and vacuums, so
// each measured recovery starts from the same table.
func (bb *benchBoard) resetMass(b *testing.B) {
	b.Helper()
	bb.exec(b, `UPDATE task_instances SET state = 'running', last_failure_kind = NULL, failure_reason = NULL,
            error_message = NULL, ended_at = NULL, infra_marked_at = NULL, infra_confirmed_at = NULL, held_at = NULL
        WHERE state <> 'running'`)
	bb.exec(b, "VACUUM ANALYZE task_instances")
}

// recover runs agentlost passes, one per 30s cycle with a 30s budget each,
// until every attempt is marked. It returns the passes it took and the time
// they took together.
func recoverAll(b *testing.B, r sdk.Reaper, bb *benchBoard, exec sdk.Executions) (int, time.Duration) {
	b.Helper()
	ctx := context.Background()
	l := ladder.Defaults()
	var (
		state   []byte
		marked  int
		elapsed time.Duration
	)
	for pass := 1; pass <= 10; pass++ {
		now := benchNow.Add(time.Duration(pass-1) * l.MaintenanceInterval)
		start := time.Now()
		var sink sdk.Collector
		res, err := r.Reap(ctx, sdk.Pass{Now: now, Ladder: l, Term: bb.term, Deadline: now.Add(l.MaintenanceInterval),
			State: state, Edition: ladder.EditionLite}, bb.store, exec, &sink)
		elapsed += time.Since(start)
		if err != nil {
			b.Fatalf("pass %d: %v", pass, err)
		}
		state = res.State
		for _, d := range sink.Decisions() {
			if d.Label != sdk.LabelAgentLost || !d.Applied {
				b.Fatalf("pass %d: unexpected decision %s applied=%v about %s: %s", pass, d.Label, d.Applied, d.Attempt, d.Detail)
			}
			marked++
		}
		if marked == massAttempts {
			return pass, elapsed
		}
	}
	b.Fatalf("10 passes marked %d of %d attempts", marked, massAttempts)
	return 0, 0
}

// BenchmarkMassRecovery marks 10,000 running Lite attempts whose agents and
// task groups are dead (a host lost with everything on it) with agentlost
// passes of a 30s budget, three ways in each iteration, one after the other
// so that a busy machine weighs on all three alike:
//
//   - in-process: agentlost.New over board.Store and lite.New;
//   - plugin: the real reaper-agentlost binary over go-plugin, the host
//     serving the board and the in-process substrate over the broker;
//   - plugin_full: the substrate out of process too (reaper-substrate-lite),
//     as reaperd runs them.
//
// It reports the most passes any recovery needed, the in-process marks per
// second, each way's median time per recovery, and the median of the
// per-iteration ratios of the plugin ways to the in-process one.
func BenchmarkMassRecovery(b *testing.B) {
	ctx := context.Background()
	bb := newBenchBoard(b)
	bb.seedRunning(b, massAttempts, 10*time.Minute)
	sub, recordDir := liteSubstrate(b)
	recordDead(b, sub.Records(), seededAttempts(massAttempts))
	ld := &loader.Loader{Dir: binDir, Logger: hclog.NewNullLogger()}
	launch := func(kind, name string, values sdk.Values) *loader.Plugin {
		p, err := ld.Launch(ctx, loader.Spec{Kind: kind, Name: name})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Kill)
		if err := p.Base().Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: values,
			Ladder: ladder.Defaults()}); err != nil {
			b.Fatal(err)
		}
		return p
	}
	inProc := agentlost.New(nil)
	if err := inProc.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: sdk.Values{},
		Ladder: ladder.Defaults()}); err != nil {
		b.Fatal(err)
	}
	plugin := launch(sdk.KindReaper, agentlost.Name, sdk.Values{}).Reaper()
	subPlugin := launch(sdk.KindSubstrate, lite.Name, sdk.Values{lite.AttrRecordDir: recordDir}).Substrate()

	ways := []struct {
		name   string
		reaper sdk.Reaper
		exec   sdk.Executions
	}{
		{"in_process", inProc, sub},
		{"plugin", plugin, sub},
		{"plugin_full", plugin, subPlugin},
	}
	times := make([][]time.Duration, len(ways))
	ratios := make([][]float64, len(ways))
	maxPasses := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for w, way := range ways {
			b.StopTimer()
			bb.resetMass(b)
			b.StartTimer()
			passes, elapsed := recoverAll(b, way.reaper, bb, way.exec)
			maxPasses = max(maxPasses, passes)
			times[w] = append(times[w], elapsed)
			ratios[w] = append(ratios[w], elapsed.Seconds()/times[0][i].Seconds())
		}
	}
	b.ReportMetric(float64(maxPasses), "passes")
	b.ReportMetric(float64(massAttempts)/median(times[0]).Seconds(), "marks/s")
	for w, way := range ways {
		b.ReportMetric(float64(median(times[w]).Microseconds())/1000, way.name+"_ms")
		if w > 0 {
			b.ReportMetric(medianFloat(ratios[w]), "x_"+way.name)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianFloat(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSteadyState runs one reap pass of the three Lite reapers
// (dispatchlost, agentlost, orphanrun, in that order, in-process) over a
// board of healthy running attempts with fresh heartbeats and nothing to
// reap: 10,000 of them, then 100,000, ten to a run. It reports the median
// time of the whole pass and of each reaper's part and, over 100,000, the
// ratio of each median to its median over 10,000: the cost of a pass must
// not grow with the healthy population.
func BenchmarkSteadyState(b *testing.B) {
	ctx := context.Background()
	sub, _ := liteSubstrate(b)
	reapers := []sdk.Reaper{dispatchlost.New(nil), agentlost.New(nil), orphanrun.New(nil)}
	names := []string{dispatchlost.Name, agentlost.Name, orphanrun.Name}
	for _, r := range reapers {
		if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: sdk.Values{},
			Ladder: ladder.Defaults()}); err != nil {
			b.Fatal(err)
		}
	}
	sizes := []int{10_000, 100_000}
	boards := map[int]*benchBoard{}
	for _, n := range sizes {
		bb := newBenchBoard(b)
		bb.seedRunning(b, n, 5*time.Second)
		boards[n] = bb
	}

	// medians[n][0] is the whole pass; medians[n][1+i] reaper i's part.
	medians := map[int][]time.Duration{}
	for _, n := range sizes {
		bb := boards[n]
		b.Run(fmt.Sprintf("Healthy%dk", n/1000), func(b *testing.B) {
			l := ladder.Defaults()
			pass := sdk.Pass{Now: benchNow, Ladder: l, Term: bb.term, Deadline: benchNow.Add(l.MaintenanceInterval),
				Edition: ladder.EditionLite}
			times := make([][]time.Duration, 1+len(reapers))
			for i := 0; i < b.N; i++ {
				var whole time.Duration
				for j, r := range reapers {
					start := time.Now()
					var sink sdk.Collector
					_, err := r.Reap(ctx, pass, bb.store, sub, &sink)
					d := time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					if ds := sink.Decisions(); len(ds) != 0 {
						b.Fatalf("a healthy board gave %d decisions, the first %+v", len(ds), ds[0])
					}
					times[1+j] = append(times[1+j], d)
					whole += d
				}
				times[0] = append(times[0], whole)
			}
			ms := make([]time.Duration, len(times))
			for k := range times {
				ms[k] = median(times[k])
			}
			medians[n] = ms
			base, compare := medians[sizes[0]], n != sizes[0]
			report := func(k int, name string) {
				b.ReportMetric(float64(ms[k].Microseconds())/1000, name+"_ms")
				if compare && base != nil {
					b.ReportMetric(ms[k].Seconds()/base[k].Seconds(), "x_10k_"+name)
				}
			}
			report(0, "median")
			for j, name := range names {
				report(1+j, name)
			}
		})
	}
}
