package lifecycle

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// UpstreamsMax bounds the upstream edges of one run, all tasks together:
// the board keeps each task's upstreams on its row and the runner's
// scheduling reads them every cycle.
const UpstreamsMax = 100_000

// GraphError is CheckGraph's refusal: the task it is about (empty for the
// run as a whole) and why.
type GraphError struct {
	Task   string
	Reason string
}

func (e *GraphError) Error() string {
	if e.Task == "" {
		return e.Reason
	}
	return fmt.Sprintf("task %q: %s", e.Task, e.Reason)
}

func graphErr(task, format string, args ...any) error {
	return &GraphError{Task: task, Reason: fmt.Sprintf(format, args...)}
}

// CheckGraph refuses a run's tasks whose upstreams do not form a graph the
// runner can drive: a task id that is empty or declared twice, an upstream
// that names no task of the run, a task named twice among one task's
// upstreams or among its own, and a cycle (named by its tasks in order).
// Each error names the task it is about. A run of tasks that name no
// upstreams is always a graph.
func CheckGraph(tasks []NewTask) error {
	index := make(map[string]int, len(tasks))
	for i, t := range tasks {
		if t.TaskID == "" {
			return graphErr("", "task %d has an empty id", i+1)
		}
		if _, dup := index[t.TaskID]; dup {
			return graphErr(t.TaskID, "declared twice")
		}
		index[t.TaskID] = i
	}
	edges := 0
	for _, t := range tasks {
		seen := make(map[string]bool, len(t.Upstreams))
		for _, u := range t.Upstreams {
			switch {
			case u == t.TaskID:
				return graphErr(t.TaskID, "names itself as an upstream")
			case seen[u]:
				return graphErr(t.TaskID, "names upstream %q twice", u)
			}
			if _, ok := index[u]; !ok {
				return graphErr(t.TaskID, "upstream %q is not a task of the run", u)
			}
			seen[u] = true
		}
		edges += len(t.Upstreams)
		if edges > UpstreamsMax {
			return graphErr("", "the run's tasks name more than %d upstreams in all", UpstreamsMax)
		}
	}
	if cycle := findCycle(tasks, index); cycle != nil {
		return graphErr(cycle[0], "its upstreams form a cycle (each waits for the next): %s", strings.Join(cycle, " -> "))
	}
	return nil
}

// findCycle returns one cycle of the upstream graph as the tasks along it,
// the first repeated at the end (a depends on b depends on a: [a b a]), or
// nil when there is none. It walks depth first without recursion (a chain
// of SubmitTasksMax tasks must not grow the stack), visiting tasks in the
// order given, so the cycle reported is the same every time.
func findCycle(tasks []NewTask, index map[string]int) []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]uint8, len(tasks))
	type frame struct{ task, next int }
	for root := range tasks {
		if state[root] != unseen {
			continue
		}
		path := []frame{{task: root}}
		state[root] = onPath
		for len(path) > 0 {
			top := &path[len(path)-1]
			ups := tasks[top.task].Upstreams
			if top.next == len(ups) {
				state[top.task] = done
				path = path[:len(path)-1]
				continue
			}
			u := index[ups[top.next]]
			top.next++
			switch state[u] {
			case onPath:
				var cycle []string
				for i := len(path) - 1; i >= 0; i-- {
					cycle = append(cycle, tasks[path[i].task].TaskID)
					if path[i].task == u {
						break
					}
				}
				// Walked from the task down its upstreams: read the other
				// way, each task names the next as an upstream.
				slices.Reverse(cycle)
				return append(cycle, tasks[u].TaskID)
			case unseen:
				state[u] = onPath
				path = append(path, frame{task: u})
			}
		}
	}
	return nil
}

// Blocked is a task instance SettleBlocked settled: its upstreams decided
// it would never run.
type Blocked struct {
	sdk.Attempt
	// State is sdk.StateUpstreamFailed or sdk.StateSkipped.
	State string
	// Failed names the upstreams that failed for good (for
	// upstream_failed), Skipped the skipped ones, by task id.
	Failed  []string
	Skipped []string
}

// upstreamSettledFailed is true for an upstream (aliased up) that ended
// without success and has nothing ahead of it (settledTI read for up): a
// task failure with no retries left, an infra failure made terminal, an
// upstream_failed of its own. A provisional infra mark, a failure with
// retries left, an attempt held for review are not: they may still
// succeed.
var upstreamSettledFailed = "(up.state NOT IN ('success', 'skipped') AND " +
	strings.ReplaceAll(settledTI, "ti.", "up.") + ")"

// SettleBlocked settles up to limit task instances of executor in state
// none, of running runs (at most ladder.PageSize; <= 0 means that), whose
// upstreams mean they will never run: upstream_failed when one upstream
// failed for good, else skipped when one was skipped. Each is ended at
// now, its error message naming those upstreams. The judgment and the
// write are one statement, guarded on the state none, the run running and
// the fence; it returns what it settled by (run, task). A task whose other
// upstreams still run is settled all the same: nothing they do can make it
// run.
func (w *Writer) SettleBlocked(ctx context.Context, executor string, limit int, now time.Time) ([]Blocked, error) {
	if err := checkExecutor(executor); err != nil {
		return nil, fmt.Errorf("board: settle blocked task instances: %w", err)
	}
	fence, fenceArgs := w.fence(5, now)
	// Each waiting task's upstreams are read by their primary key, in a
	// lateral subquery per task: joined as a set, the planner hashes every
	// task instance of the working set instead.
	sql := `WITH blocked AS (
    SELECT ti.run_id, ti.task_id, j.failed, j.skipped
    ` + workingFrom + `
    CROSS JOIN LATERAL (
        SELECT coalesce(array_agg(up.task_id ORDER BY up.task_id) FILTER (WHERE ` + upstreamSettledFailed + `), '{}') AS failed,
            coalesce(array_agg(up.task_id ORDER BY up.task_id) FILTER (WHERE up.state = 'skipped'), '{}') AS skipped
        FROM unnest(ti.upstreams) u(id)
        JOIN task_instances up ON up.run_id = ti.run_id AND up.task_id = u.id
    ) j
    ` + workingWhere + ` AND ti.state = 'none' AND cardinality(ti.upstreams) > 0
      AND (cardinality(j.failed) > 0 OR cardinality(j.skipped) > 0)
    ORDER BY ti.run_id, ti.task_id LIMIT ` + strconv.Itoa(pageLimit(limit)) + `
)
UPDATE task_instances ti SET
    state = CASE WHEN cardinality(b.failed) > 0 THEN 'upstream_failed' ELSE 'skipped' END,
    ended_at = $4, updated_at = $4,
    error_message = CASE WHEN cardinality(b.failed) > 0
        THEN 'upstream failed: ' || array_to_string(b.failed, ', ')
        ELSE 'upstream skipped: ' || array_to_string(b.skipped, ', ') END
FROM blocked b, runs r
WHERE ti.run_id = b.run_id AND ti.task_id = b.task_id AND ti.state = 'none'
  AND r.run_id = ti.run_id AND r.state = 'running'
  AND ` + fence + `
RETURNING ti.run_id, ti.task_id, ti.try_number, ti.attempt_epoch, ti.state, b.failed, b.skipped`
	ctx, cancel := w.bound(ctx)
	defer cancel()
	rows, err := w.pool.Query(ctx, sql, append([]any{executor, nil, nil, now}, fenceArgs...)...)
	if err != nil {
		return nil, fmt.Errorf("board: settle blocked %s task instances: %w", executor, err)
	}
	bs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Blocked, error) {
		var b Blocked
		err := row.Scan(&b.RunID, &b.TaskID, &b.Try, &b.Epoch, &b.State, &b.Failed, &b.Skipped)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("board: settle blocked %s task instances: %w", executor, err)
	}
	if len(bs) == 0 {
		if err := w.deposed(ctx, "settle blocked", now); err != nil {
			return nil, fmt.Errorf("board: settle blocked %s task instances: %w", executor, err)
		}
	}
	slices.SortFunc(bs, func(a, b Blocked) int {
		return cmp.Or(cmp.Compare(a.RunID, b.RunID), cmp.Compare(a.TaskID, b.TaskID))
	})
	return bs, nil
}
