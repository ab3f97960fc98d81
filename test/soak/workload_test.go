package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// A task kind of the workload: its command and what it declares.
type taskKind struct {
	name    string
	weight  int
	command func(rng *rand.Rand) string
	retries int32
	timeout time.Duration
}

// taskKinds are the shapes of the workload's short tasks. Every command
// ends within longestTask on its own (or at its timeout).
var taskKinds = []taskKind{
	{name: "succeed", weight: 4, command: func(rng *rand.Rand) string {
		return fmt.Sprintf("sleep %d.%d", 2+rng.IntN(3), rng.IntN(10))
	}},
	{name: "fail_then_retry", weight: 2, retries: 1, command: func(rng *rand.Rand) string {
		return fmt.Sprintf(`if [ "$REAPER_TRY" = 1 ]; then sleep %d; exit 3; fi; sleep 2`, 1+rng.IntN(3))
	}},
	{name: "trap_sigterm", weight: 1, command: func(rng *rand.Rand) string {
		// An ignored signal stays ignored across exec: the whole group
		// declines SIGTERM, so only SIGKILL ends it early.
		return fmt.Sprintf("trap '' TERM; sleep %d", 3+rng.IntN(3))
	}},
	{name: "fork_children", weight: 2, command: func(rng *rand.Rand) string {
		return fmt.Sprintf("sleep %d & sleep %d & sleep 2; wait", 3+rng.IntN(3), 2+rng.IntN(3))
	}},
	{name: "escape_setsid", weight: 1, command: func(rng *rand.Rand) string {
		// The escaped child leaves the group (the documented boundary):
		// nobody stops it but itself (after escapeLife) or the injector.
		return `setsid sh -c 'echo $$ > "$0"; exec sleep ` + fmt.Sprint(int(escapeLife.Seconds())) + `' ` +
			`"$` + escEnv + `/$REAPER_RUN_ID.$REAPER_TASK_ID.$REAPER_TRY.$REAPER_EPOCH" </dev/null >/dev/null 2>&1 & ` +
			fmt.Sprintf("sleep %d", 3+rng.IntN(3))
	}},
	{name: "execution_timeout", weight: 1, timeout: 3 * time.Second, command: func(*rand.Rand) string {
		return "sleep 30"
	}},
}

// longestTask bounds one execution of any task kind; escapeLife the life of
// an escaped child.
const (
	longestTask = 6 * time.Second
	escapeLife  = 12 * time.Second
)

// kubeTaskKinds are the shapes of the kube edition's tasks: all but the
// escaping child (a container's processes end with it; nothing escapes a
// pod).
func kubeTaskKinds() []taskKind {
	var out []taskKind
	for _, k := range taskKinds {
		if k.name != "escape_setsid" {
			out = append(out, k)
		}
	}
	return out
}

// workload submits the stream of runs.
type workload struct {
	w        *lifecycle.Writer
	rng      *rand.Rand // only the workload's goroutine and bursts under mu use it
	tl       timeline
	executor string     // sdk.ExecutorLite or sdk.ExecutorKube
	shapes   []taskKind // the edition's task kinds
	// gap is the stream's least wait between two runs (it waits gap to
	// twice gap); zero: streamGap.
	gap time.Duration

	mu    sync.Mutex
	runs  []string
	kinds map[string]int
	next  int
}

func (wl *workload) pickKind() taskKind {
	return drawWeighted(wl.rng, wl.shapes, func(k taskKind) int { return k.weight })
}

// drawWeighted draws one of items, each as often as its weight.
func drawWeighted[T any](rng *rand.Rand, items []T, weight func(T) int) T {
	total := 0
	for _, it := range items {
		total += weight(it)
	}
	n := rng.IntN(total)
	for _, it := range items {
		if n < weight(it) {
			return it
		}
		n -= weight(it)
	}
	return items[0]
}

// submit creates n runs of 2 to 4 tasks each.
func (wl *workload) submit(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		wl.mu.Lock()
		wl.next++
		run := lifecycle.NewRun{RunID: fmt.Sprintf("soak-%05d", wl.next), DagID: "soak", State: sdk.RunRunning}
		tasks := 2 + wl.rng.IntN(3)
		for j := 1; j <= tasks; j++ {
			k := wl.pickKind()
			run.Tasks = append(run.Tasks, lifecycle.NewTask{
				TaskID: fmt.Sprintf("t%d_%s", j, k.name), Executor: wl.executor,
				Retries: k.retries, Command: k.command(wl.rng), ExecutionTimeout: k.timeout,
			})
			wl.kinds[k.name]++
		}
		wl.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := wl.w.CreateRun(cctx, run, wl.tl.now())
		cancel()
		if err != nil {
			return fmt.Errorf("submit run %s: %w", run.RunID, err)
		}
		wl.mu.Lock()
		wl.runs = append(wl.runs, run.RunID)
		wl.mu.Unlock()
	}
	return nil
}

// streamGap is the stream's least wait between two runs by default.
const streamGap = 1500 * time.Millisecond

// stream submits a run every gap to twice gap (default 1.5 to 3 seconds)
// until ctx ends. A submit that fails (the database is restarting) is
// dropped: it is not a run.
func (wl *workload) stream(ctx context.Context) {
	gap := wl.gap
	if gap <= 0 {
		gap = streamGap
	}
	for {
		wl.mu.Lock()
		wait := gap + time.Duration(wl.rng.Int64N(int64(gap)))
		wl.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		_ = wl.submit(ctx, 1)
	}
}

func (wl *workload) submitted() []string {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]string(nil), wl.runs...)
}
