package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivershared/baseservice"
	"github.com/riverqueue/river/rivershared/riverpilot"
	"github.com/riverqueue/river/rivertype"

	"github.com/dexaflow/reaper/testkit/machinecpu"
)

// The River side: N jobs stuck in running (attempted two hours ago, attempt
// 5 of 25, so the rescuer retries each of them, an hour later: far enough
// that River's scheduler leaves them alone while the benchmark runs), and a
// River client whose leader runs the JobRescuer at its start. The rescuer
// reaches the database only through its pilot's two calls (JobGetStuck,
// JobRescueMany), so a pilot that times them measures its work exactly:
// a batch is its fetch, the decisions it makes in Go, and its update, from
// the fetch's start to the update's end. What lies before the first fetch
// (leader election and the rescuer's staggered start) and between batches
// (its deliberate back-off sleep) is reported apart.

// stuckArgs is the stuck jobs' kind; its worker never runs (the client works
// another queue), it only lets the rescuer decide on a retry.
type stuckArgs struct{}

func (stuckArgs) Kind() string { return "stuck" }

type stuckWorker struct {
	river.WorkerDefaults[stuckArgs]
}

func (stuckWorker) Work(context.Context, *river.Job[stuckArgs]) error { return nil }

// laterRetry retries a job an hour after now.
type laterRetry struct{}

func (laterRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Hour) }

// span is one pilot call.
type span struct {
	fetch      bool
	rows       int
	start, end time.Time
	// The machine's CPU seconds (machinecpu.Busy) at the start and the end.
	cpuStart, cpuEnd float64
}

// timedPilot is River's standard pilot with the rescuer's two calls timed.
type timedPilot struct {
	riverpilot.StandardPilot
	mu    sync.Mutex
	spans []span
	max   int           // the batch size of the last fetch
	done  chan struct{} // closed after the batch that ends the rescue run
	once  sync.Once
}

var _ riverpilot.PilotJobRescuer = (*timedPilot)(nil)

func (p *timedPilot) JobGetStuck(ctx context.Context, exec riverdriver.Executor, params *riverdriver.JobGetStuckParams) ([]*rivertype.JobRow, error) {
	cpuStart, start := machinecpu.Busy(), time.Now()
	rows, err := exec.JobGetStuck(ctx, params)
	end, cpuEnd := time.Now(), machinecpu.Busy()
	p.mu.Lock()
	p.spans = append(p.spans, span{fetch: true, rows: len(rows), start: start, end: end, cpuStart: cpuStart, cpuEnd: cpuEnd})
	p.max = params.Max
	p.mu.Unlock()
	if err == nil && len(rows) == 0 {
		p.once.Do(func() { close(p.done) })
	}
	return rows, err
}

func (p *timedPilot) JobRescueMany(ctx context.Context, exec riverdriver.Executor, params *riverdriver.JobRescueManyParams) (*struct{}, error) {
	cpuStart, start := machinecpu.Busy(), time.Now()
	res, err := exec.JobRescueMany(ctx, params)
	end, cpuEnd := time.Now(), machinecpu.Busy()
	p.mu.Lock()
	p.spans = append(p.spans, span{rows: len(params.ID), start: start, end: end, cpuStart: cpuStart, cpuEnd: cpuEnd})
	short := len(params.ID) < p.max
	p.mu.Unlock()
	if err == nil && short {
		p.once.Do(func() { close(p.done) })
	}
	return res, err
}

// timedDriver is the pgx v5 driver that hands River the timed pilot.
type timedDriver struct {
	*riverpgxv5.Driver
	pilot *timedPilot
}

func (d *timedDriver) PluginInit(*baseservice.Archetype) {}
func (d *timedDriver) PluginPilot() riverpilot.Pilot     { return d.pilot }

// riverResult is one rescue run.
type riverResult struct {
	batches  int
	work     time.Duration // fetch + decide + update, every batch
	cpu      float64       // the machine's CPU seconds over the work (NaN when unknown)
	startup  time.Duration // from the client's start to the first fetch
	sleeps   time.Duration // between batches
	total    time.Duration // from the client's start to the last update
	rescued  int
	batchMax int
}

// migrateRiver makes River's schema in pool.
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river: migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river: migrate: %w", err)
	}
	return nil
}

// seedRiver empties river_job and inserts n stuck jobs.
func seedRiver(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{"TRUNCATE river_job", nil},
		{`INSERT INTO river_job (args, attempt, attempted_at, attempted_by, created_at, kind, max_attempts,
            metadata, priority, queue, state, scheduled_at)
        SELECT '{}', 5, now() - interval '2 hours', ARRAY['bench-host'], now() - interval '3 hours', 'stuck', 25,
            '{}', 1, 'stuck', 'running', now() - interval '2 hours'
        FROM generate_series(1, $1::int)`, []any{n}},
		{"VACUUM ANALYZE river_job", nil},
	} {
		if _, err := pool.Exec(ctx, st.sql, st.args...); err != nil {
			return fmt.Errorf("river: seed %d stuck jobs: %w", n, err)
		}
	}
	return nil
}

// runRiver starts a River client over pool with its defaults but the
// rescue threshold (an hour) and waits for its rescuer's first run to end.
func runRiver(ctx context.Context, pool *pgxpool.Pool, n int) (riverResult, error) {
	pilot := &timedPilot{done: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, &stuckWorker{})
	client, err := river.NewClient[pgx.Tx](&timedDriver{Driver: riverpgxv5.New(pool), pilot: pilot}, &river.Config{
		Logger:               slog.New(slog.NewTextHandler(io.Discard, nil)),
		Queues:               map[string]river.QueueConfig{"other": {MaxWorkers: 1}},
		RescueStuckJobsAfter: time.Hour,
		RetryPolicy:          laterRetry{},
		Workers:              workers,
	})
	if err != nil {
		return riverResult{}, fmt.Errorf("river: new client: %w", err)
	}
	started := time.Now()
	if err := client.Start(ctx); err != nil {
		return riverResult{}, fmt.Errorf("river: start: %w", err)
	}
	var waitErr error
	select {
	case <-pilot.done:
	case <-time.After(10 * time.Minute):
		waitErr = fmt.Errorf("river: the rescuer did not finish in 10 minutes")
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && waitErr == nil {
		waitErr = fmt.Errorf("river: stop: %w", err)
	}
	if waitErr != nil {
		return riverResult{}, waitErr
	}

	pilot.mu.Lock()
	spans := pilot.spans
	pilot.mu.Unlock()
	res := riverResult{batchMax: pilot.max}
	var (
		last    time.Time // the end of the previous call
		lastCPU float64   // the machine's CPU then
	)
	for _, s := range spans {
		if s.fetch {
			// A fetch starts a batch: what came before it is the start-up
			// wait or a back-off sleep.
			if last.IsZero() {
				res.startup = s.start.Sub(started)
			} else {
				res.sleeps += s.start.Sub(last)
			}
			res.work += s.end.Sub(s.start)
			res.cpu += s.cpuEnd - s.cpuStart
			res.batches++
		} else {
			// An update ends its batch: the decisions made between the
			// fetch and it are work.
			res.work += s.end.Sub(last)
			res.cpu += s.cpuEnd - lastCPU
			res.rescued += s.rows
		}
		last, lastCPU = s.end, s.cpuEnd
	}
	res.total = last.Sub(started)
	var retried int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job
        WHERE state = 'retryable' AND cardinality(errors) = 1 AND scheduled_at > now()`).Scan(&retried); err != nil {
		return res, fmt.Errorf("river: count rescued jobs: %w", err)
	}
	if retried != n || res.rescued != n {
		return res, fmt.Errorf("river: rescued %d (%d retryable) of %d stuck jobs", res.rescued, retried, n)
	}
	return res, nil
}
