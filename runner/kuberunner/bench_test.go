package kuberunner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// benchTasks is how many kube tasks each iteration of BenchmarkDispatch
// dispatches.
const benchTasks = 250

// BenchmarkDispatch measures one cycle that schedules and dispatches a run
// of benchTasks kube tasks: that many pod creates on the real API server
// and the board's writes around them, created on the tick (buffer 0) and
// through the dispatch workers (a buffer of 64 served by 4 and by 8
// workers), with the client at reaperd's rate limit (kube.QPSDefault,
// kube.BurstDefault: what FromSettings gives the runner) and with none. It
// reports pods/s. Run it with a fixed count (-benchtime 2x): each
// iteration makes benchTasks pods.
func BenchmarkDispatch(b *testing.B) {
	for _, rate := range []struct {
		name  string
		qps   float32
		burst int
	}{{"reaperd-rate", kube.QPSDefault, kube.BurstDefault}, {"unlimited", -1, 0}} {
		for _, m := range []struct{ buffer, workers int }{{0, 0}, {64, 4}, {64, 8}} {
			b.Run(fmt.Sprintf("%s/buffer=%d/workers=%d", rate.name, m.buffer, m.workers), func(b *testing.B) {
				benchDispatch(b, rate.qps, rate.burst, m.buffer, m.workers)
			})
		}
	}
}

func benchDispatch(b *testing.B, qps float32, burst, buffer, workers int) {
	c := kubetest.Current(b)
	w := lifecycle.New(pgtest.NewDB(b), lifecycle.Options{})
	ns := c.NewNamespace(b)
	clk := clock.NewFake(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	rc := c.AdminConfig()
	rc.QPS, rc.Burst = qps, burst
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	r, err := kuberunner.New(kuberunner.Config{Client: cs, Namespace: ns, Image: "x",
		Ladder: ladder.Defaults(), Clock: clk, DispatchBuffer: buffer, DispatchWorkers: workers}, w)
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		run := lifecycle.NewRun{RunID: fmt.Sprintf("bench-%d", i), DagID: "dag"}
		for j := range benchTasks {
			run.Tasks = append(run.Tasks, lifecycle.NewTask{TaskID: fmt.Sprintf("t%04d", j), Executor: "kube", Command: "true"})
		}
		if err := w.CreateRun(context.Background(), run, clk.Now()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := r.RunOnce(context.Background(), clk.Now())
		total += time.Since(start)
		if err != nil || res.Dispatched != benchTasks {
			b.Fatalf("dispatched %d: %v", res.Dispatched, err)
		}
	}
	b.ReportMetric(float64(benchTasks*b.N)/total.Seconds(), "pods/s")
}
