package kuberunner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// BenchmarkDispatch measures one cycle that schedules and dispatches a run
// of 100 kube tasks: 100 pod creates on the real API server and the board's
// writes around them. It reports pods/s.
func BenchmarkDispatch(b *testing.B) {
	c := kubetest.Current(b)
	w := lifecycle.New(pgtest.NewDB(b), lifecycle.Options{})
	ns := c.NewNamespace(b)
	clk := clock.NewFake(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	r, err := kuberunner.New(kuberunner.Config{Client: c.Client(b), Namespace: ns, Image: "x",
		Ladder: ladder.Defaults(), Clock: clk}, w)
	if err != nil {
		b.Fatal(err)
	}
	const tasks = 100
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		run := lifecycle.NewRun{RunID: fmt.Sprintf("bench-%d", i), DagID: "dag"}
		for j := range tasks {
			run.Tasks = append(run.Tasks, lifecycle.NewTask{TaskID: fmt.Sprintf("t%03d", j), Executor: "kube", Command: "true"})
		}
		if err := w.CreateRun(context.Background(), run, clk.Now()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := r.RunOnce(context.Background(), clk.Now())
		total += time.Since(start)
		if err != nil || res.Dispatched != tasks {
			b.Fatalf("dispatched %d: %v", res.Dispatched, err)
		}
	}
	b.ReportMetric(float64(tasks*b.N)/total.Seconds(), "pods/s")
}
