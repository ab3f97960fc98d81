// Package massbench is the mass-recovery workload shared by the reapers'
// benchmark (test/reapers, BenchmarkMassRecovery) and the peer benchmark
// (tools/peerbench): a board of N running Lite attempts, ten to a run,
// silent for ten minutes, whose agents and task groups are all gone (their
// records name processes that have exited), recovered by agentlost passes of
// a 30s budget until every attempt is marked, the decisions of each pass
// written to the audit as the host writes them.
package massbench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/plugin"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
)

// Now is the time of the first pass; the seeded rows are placed relative to
// it.
var Now = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

// TasksPerRun is how many task instances each seeded run holds.
const TasksPerRun = 10

// Board is a board with a current leadership term whose lease covers every
// pass of a benchmark.
type Board struct {
	Pool  *pgxpool.Pool
	Store *board.Store
	Term  int64
}

// NewBoard takes the leadership of the board in pool (which holds the
// board's schema) for a day from an hour before Now.
func NewBoard(ctx context.Context, pool *pgxpool.Pool) (*Board, error) {
	store := board.New(pool, board.Options{})
	lease, ok, err := store.TryAcquire(ctx, "bench", 24*time.Hour, Now.Add(-time.Hour))
	if err != nil {
		return nil, fmt.Errorf("massbench: acquire leadership: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("massbench: acquire leadership: another leader holds the board")
	}
	return &Board{Pool: pool, Store: store, Term: lease.Term}, nil
}

func (b *Board) exec(ctx context.Context, sql string, args ...any) error {
	if _, err := b.Pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("massbench: %s: %w", firstLine(sql), err)
	}
	return nil
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}

// SeedRunning inserts n running Lite attempts, TasksPerRun to a run, in two
// statements. The attempts entered running between 50 and 10 minutes before
// Now; each last heartbeated heartbeatAgo (plus up to a second, spread over
// the rows) before it.
func (b *Board) SeedRunning(ctx context.Context, n int, heartbeatAgo time.Duration) error {
	return b.SeedRunningOn(ctx, sdk.ExecutorLite, n, heartbeatAgo)
}

// SeedRunningOn is SeedRunning with the attempts on executor (the kube
// benchmarks seed kube attempts, the ones of Attempts(n)).
func (b *Board) SeedRunningOn(ctx context.Context, executor string, n int, heartbeatAgo time.Duration) error {
	return b.SeedRunningAt(ctx, executor, n, Now, heartbeatAgo)
}

// SeedRunningAt is SeedRunningOn with the rows placed relative to now
// instead of Now (a benchmark that runs on the wall clock).
func (b *Board) SeedRunningAt(ctx context.Context, executor string, n int, now time.Time, heartbeatAgo time.Duration) error {
	if err := b.exec(ctx, `INSERT INTO runs (run_id, dag_id, state, started_at, updated_at)
        SELECT 'run' || lpad(r::text, 6, '0'), 'dag', 'running', $1::timestamptz - interval '1 hour', $1
        FROM generate_series(0, $2::int - 1) r`, now, (n+TasksPerRun-1)/TasksPerRun); err != nil {
		return err
	}
	if err := b.exec(ctx, `INSERT INTO task_instances (run_id, task_id, executor, state, queued_at, running_at,
            last_heartbeat_at, updated_at)
        SELECT 'run' || lpad((i / $4::int)::text, 6, '0'), 'task' || lpad((i % $4::int)::text, 2, '0'), $5, 'running',
            $1::timestamptz - interval '51 minutes' + (i % 2400) * interval '1 second',
            $1::timestamptz - interval '50 minutes' + (i % 2400) * interval '1 second',
            $1::timestamptz - $3::interval - (i % 1000) * interval '1 millisecond', $1
        FROM generate_series(0, $2::int - 1) i`, now, n, heartbeatAgo, TasksPerRun, executor); err != nil {
		return err
	}
	return b.exec(ctx, "VACUUM ANALYZE runs, task_instances")
}

// Reset puts every attempt back to running, unmarked, empties the audit and
// vacuums, so that each measured recovery starts from the same tables.
func (b *Board) Reset(ctx context.Context) error {
	if err := b.exec(ctx, `UPDATE task_instances SET state = 'running', last_failure_kind = NULL, failure_reason = NULL,
            error_message = NULL, ended_at = NULL, infra_marked_at = NULL, infra_confirmed_at = NULL, held_at = NULL
        WHERE state <> 'running'`); err != nil {
		return err
	}
	if err := b.exec(ctx, "TRUNCATE reap_decisions"); err != nil {
		return err
	}
	return b.exec(ctx, "VACUUM ANALYZE task_instances, reap_decisions")
}

// Attempts lists the first n seeded attempts.
func Attempts(n int) []sdk.Attempt {
	out := make([]sdk.Attempt, n)
	for i := range out {
		out[i] = sdk.Attempt{RunID: fmt.Sprintf("run%06d", i/TasksPerRun), TaskID: fmt.Sprintf("task%02d", i%TasksPerRun), Try: 1}
	}
	return out
}

// NewLite is the Lite substrate, in process, over the record directory dir.
func NewLite(ctx context.Context, dir string) (*lite.Substrate, error) {
	sub := lite.New(hclog.NewNullLogger())
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite,
		Values: sdk.Values{lite.AttrRecordDir: dir}, Ladder: ladder.Defaults()}); err != nil {
		return nil, fmt.Errorf("massbench: configure the Lite substrate: %w", err)
	}
	return sub, nil
}

// deadProcesses returns n processes that have exited and been reaped, with
// the start times they had.
func deadProcesses(n int) ([]proc.Info, error) {
	out := make([]proc.Info, 0, n)
	for range n {
		cmd := exec.Command("cat")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, fmt.Errorf("massbench: start a process: %w", err)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("massbench: start a process: %w", err)
		}
		info, err := proc.Stat(cmd.Process.Pid)
		stdin.Close()
		if werr := cmd.Wait(); err == nil && werr != nil {
			err = werr
		}
		if err != nil {
			return nil, fmt.Errorf("massbench: read a process: %w", err)
		}
		out = append(out, info)
	}
	return out, nil
}

// RecordDead writes, for every attempt, the records a killed agent leaves
// behind: its .pid record and its task's .pgid record, naming processes
// that have exited.
func RecordDead(dir *records.Dir, attempts []sdk.Attempt) error {
	boot, _ := proc.BootID()
	dead, err := deadProcesses(16)
	if err != nil {
		return err
	}
	for i, a := range attempts {
		agentProc, leader := dead[i%len(dead)], dead[(i+1)%len(dead)]
		if err := dir.WriteAgent(records.AgentRecord{Attempt: a, PID: agentProc.PID, Start: agentProc.Start, Boot: boot}); err != nil {
			return fmt.Errorf("massbench: write the records of %s: %w", a, err)
		}
		if err := dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: leader.PID, AgentPID: agentProc.PID,
			AgentStart: agentProc.Start, LeaderStart: leader.Start, Boot: boot}); err != nil {
			return fmt.Errorf("massbench: write the records of %s: %w", a, err)
		}
	}
	return nil
}

// Workload is a seeded board of n dead Lite attempts and the in-process
// Lite substrate over their records.
type Workload struct {
	N         int
	Board     *Board
	Lite      *lite.Substrate
	RecordDir string
}

// NewWorkload seeds n dead attempts on the board in pool and writes their
// records under dir.
func NewWorkload(ctx context.Context, pool *pgxpool.Pool, dir string, n int) (*Workload, error) {
	b, err := NewBoard(ctx, pool)
	if err != nil {
		return nil, err
	}
	if err := b.SeedRunning(ctx, n, 10*time.Minute); err != nil {
		return nil, err
	}
	recordDir := filepath.Join(dir, "records")
	sub, err := NewLite(ctx, recordDir)
	if err != nil {
		return nil, err
	}
	if err := RecordDead(sub.Records(), Attempts(n)); err != nil {
		return nil, err
	}
	return &Workload{N: n, Board: b, Lite: sub, RecordDir: recordDir}, nil
}

// InProcess is agentlost in process, configured for Lite.
func InProcess(ctx context.Context) (sdk.Reaper, error) {
	r := agentlost.New(nil)
	if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: sdk.Values{},
		Ladder: ladder.Defaults()}); err != nil {
		return nil, fmt.Errorf("massbench: configure agentlost: %w", err)
	}
	return r, nil
}

// Plugins are the real plugin binaries of a recovery out of process.
type Plugins struct {
	Reaper    sdk.Reaper    // reaper-agentlost over go-plugin
	Substrate sdk.Substrate // reaper-substrate-lite over go-plugin, on the workload's records
	kill      []func()
}

// Close kills the plugins.
func (p *Plugins) Close() {
	for _, k := range p.kill {
		k()
	}
}

// LaunchPlugins starts reaper-agentlost and reaper-substrate-lite from
// binDir, configured for Lite, the substrate over the workload's records.
func (w *Workload) LaunchPlugins(ctx context.Context, binDir string) (*Plugins, error) {
	ld := &loader.Loader{Dir: binDir, Logger: hclog.NewNullLogger()}
	out := &Plugins{}
	launch := func(kind, name string, values sdk.Values) (*loader.Plugin, error) {
		p, err := ld.Launch(ctx, loader.Spec{Kind: kind, Name: name})
		if err != nil {
			return nil, fmt.Errorf("massbench: launch %s %s: %w", kind, name, err)
		}
		out.kill = append(out.kill, p.Kill)
		if err := p.Base().Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: values,
			Ladder: ladder.Defaults()}); err != nil {
			return nil, fmt.Errorf("massbench: configure %s %s: %w", kind, name, err)
		}
		return p, nil
	}
	r, err := launch(sdk.KindReaper, agentlost.Name, sdk.Values{})
	if err != nil {
		out.Close()
		return nil, err
	}
	s, err := launch(sdk.KindSubstrate, lite.Name, sdk.Values{lite.AttrRecordDir: w.RecordDir})
	if err != nil {
		out.Close()
		return nil, err
	}
	out.Reaper, out.Substrate = r.Reaper(), s.Substrate()
	return out, nil
}

// Recovery is what one recovery took.
type Recovery struct {
	Passes  int
	Marked  int
	Elapsed time.Duration // the passes and their audit writes together
	// Audit is the wait, after each pass, for the audit writes still
	// under way (part of Elapsed); the rest of the audit went on beside
	// the pass.
	Audit time.Duration
}

// MaxPasses bounds a recovery: a recovery that needs more is an error.
const MaxPasses = 20

// Recover runs agentlost passes of r over exec, one per 30s cycle with a
// 30s budget each, until every attempt of the workload is marked agent_lost,
// each pass's decisions written to the audit while it goes on and waited for
// after it, through the host's own sink (audit.Sink). Any decision but an
// applied agent_lost is an error.
func (w *Workload) Recover(ctx context.Context, r sdk.Reaper, exec sdk.Executions) (Recovery, error) {
	return Recover(ctx, Spec{Board: w.Board, N: w.N, Edition: ladder.EditionLite, Label: sdk.LabelAgentLost,
		Reaper: agentlost.Name}, r, exec)
}

// Spec is what a recovery marks, on which board.
type Spec struct {
	Board   *Board
	N       int    // the attempts to mark
	Edition string // the passes' edition
	Label   string // the mark every decision must be, applied
	Reaper  string // the reaper's name in the audit
	// Marks, when set, is the board the passes read and write through (a
	// wrapper of Board.Store that times or counts them); Board.Store when
	// nil. The audit is written to Board.Store.
	Marks sdk.Board
}

// Recover runs passes of r over exec, one per 30s cycle with a 30s budget
// each (the fake time of pass k is Now + (k-1) x 30s, each pass carrying the
// state of the one before), until spec.N attempts are marked, each pass's
// decisions written to the audit while it goes on and waited for after it,
// through the host's own sink (audit.Sink), streamed as the host streams
// them (checked, counted and let go once written). Any decision but an
// applied spec.Label is an error. The process runs under the host's GC
// target (plugin.TuneGC) while it recovers, as reaperd does.
func Recover(ctx context.Context, spec Spec, r sdk.Reaper, exec sdk.Executions) (Recovery, error) {
	if old := plugin.TuneGC(); old >= 0 {
		defer debug.SetGCPercent(old)
	}
	l := ladder.Defaults()
	marks := spec.Marks
	if marks == nil {
		marks = spec.Board.Store
	}
	var (
		state []byte
		out   Recovery
	)
	for pass := 1; pass <= MaxPasses; pass++ {
		now := Now.Add(time.Duration(pass-1) * l.MaintenanceInterval)
		start := time.Now()
		sink := audit.NewSink(ctx, spec.Board.Store, spec.Board.Term, now, spec.Reaper, false)
		var (
			marked     int
			unexpected *sdk.Decision
		)
		sink.Stream(func(ds []sdk.Decision) {
			for i := range ds {
				if ds[i].Label != spec.Label || !ds[i].Applied {
					if unexpected == nil {
						unexpected = &ds[i]
					}
					continue
				}
				marked++
			}
		})
		res, err := r.Reap(ctx, sdk.Pass{Now: now, Ladder: l, Term: spec.Board.Term, Deadline: now.Add(l.MaintenanceInterval),
			State: state, Edition: spec.Edition}, marks, exec, sink)
		auditStart := time.Now()
		_, auditErr := sink.Wait()
		out.Audit += time.Since(auditStart)
		if err != nil {
			return out, fmt.Errorf("massbench: pass %d: %w", pass, err)
		}
		if auditErr != nil {
			return out, fmt.Errorf("massbench: pass %d: %w", pass, auditErr)
		}
		out.Elapsed += time.Since(start)
		out.Passes = pass
		state = res.State
		if d := unexpected; d != nil {
			return out, fmt.Errorf("massbench: pass %d: unexpected decision %s applied=%v about %s: %s",
				pass, d.Label, d.Applied, d.Attempt, d.Detail)
		}
		out.Marked += marked
		if out.Marked == spec.N {
			return out, nil
		}
	}
	return out, fmt.Errorf("massbench: %d passes marked %d of %d attempts", MaxPasses, out.Marked, spec.N)
}

// Each runs do for every index from 0 to n-1 on workers goroutines, and
// returns the first error (after which no new index starts): the
// benchmarks' fleets are made and unmade this way.
func Each(n, workers int, do func(i int) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Pointer[error]
	)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || first.Load() != nil {
					return
				}
				if err := do(i); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}
