package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The plain-SQL baselines run on the reaper's own board (the same table,
// rows and indexes the reaper drains): a keyset page of the silent running
// attempts, then one guarded update of the page from arrays, page after
// page until a short page. Per row: no liveness read, no decision, no
// evidence, no audit; the guard pins the attempt and its state only.

const plainPageSQL = `SELECT run_id, task_id, try_number, attempt_epoch, last_heartbeat_at
FROM task_instances
WHERE state = 'running' AND executor = 'lite' AND last_heartbeat_at < $1
  AND (last_heartbeat_at, run_id, task_id) > ($2, $3, $4)
ORDER BY last_heartbeat_at, run_id, task_id
LIMIT $5`

const plainMarkSQL = `UPDATE task_instances ti SET state = 'failed', last_failure_kind = 'infra',
    failure_reason = 'agent_lost', error_message = 'agent_lost', ended_at = $5, updated_at = $5
FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[]) AS r(run_id, task_id, try_number, attempt_epoch)
WHERE ti.run_id = r.run_id AND ti.task_id = r.task_id
  AND ti.try_number = r.try_number AND ti.attempt_epoch = r.attempt_epoch
  AND ti.state = 'running'`

// runPlain marks every silent attempt with pages of size page and returns
// the time it took and the rows it marked.
func runPlain(ctx context.Context, pool *pgxpool.Pool, now time.Time, page int) (time.Duration, int, error) {
	threshold := now.Add(-5 * time.Minute)
	var (
		afterAt           = time.Time{}
		afterRun, afterTk string
		marked            int
	)
	start := time.Now()
	for {
		rows, err := pool.Query(ctx, plainPageSQL, threshold, afterAt, afterRun, afterTk, page)
		if err != nil {
			return 0, marked, fmt.Errorf("plain: list a page: %w", err)
		}
		var (
			runs, tasks   []string
			tries, epochs []int32
			run, task     string
			try, epoch    int32
			hb            time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&run, &task, &try, &epoch, &hb}, func() error {
			runs, tasks, tries, epochs = append(runs, run), append(tasks, task), append(tries, try), append(epochs, epoch)
			afterAt, afterRun, afterTk = hb, run, task
			return nil
		})
		if err != nil {
			return 0, marked, fmt.Errorf("plain: read a page: %w", err)
		}
		if len(runs) > 0 {
			tag, err := pool.Exec(ctx, plainMarkSQL, runs, tasks, tries, epochs, now)
			if err != nil {
				return 0, marked, fmt.Errorf("plain: mark a page: %w", err)
			}
			marked += int(tag.RowsAffected())
		}
		if len(runs) < page {
			return time.Since(start), marked, nil
		}
	}
}
