package kuberunner_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
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
// dispatches: REAPER_BENCH_DISPATCH_TASKS, else 1,000.
func benchTasks(b *testing.B) int {
	v := os.Getenv("REAPER_BENCH_DISPATCH_TASKS")
	if v == "" {
		return 1000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("REAPER_BENCH_DISPATCH_TASKS=%q: want a count of tasks", v)
	}
	return n
}

// BenchmarkDispatch measures one cycle that schedules and dispatches a run
// of benchTasks kube tasks: that many pod creates on the real API server
// and the board's writes around them, created on the tick (buffer 0) and
// through the dispatch workers (a buffer of 64 served by 4 and by 8
// workers), with the client at reaperd's rate limit (kube.QPSDefault,
// kube.BurstDefault: what FromSettings gives the runner), with none, and
// with none over a link that adds a round trip of 20 ms to each create
// (an API server across a network, or behind an admission webhook: the
// test cluster's is on loopback on the same two cores as everything
// else). It
// reports pods/s. Run it with a fixed count (-benchtime 1x): each
// iteration makes benchTasks pods.
func BenchmarkDispatch(b *testing.B) {
	for _, rate := range []struct {
		name  string
		qps   float32
		burst int
		rtt   time.Duration
	}{{"reaperd-rate", kube.QPSDefault, kube.BurstDefault, 0}, {"unlimited", -1, 0, 0}, {"unlimited-rtt20ms", -1, 0, 20 * time.Millisecond}} {
		for _, m := range []struct{ buffer, workers int }{{0, 0}, {64, 4}, {64, 8}} {
			b.Run(fmt.Sprintf("%s/buffer=%d/workers=%d", rate.name, m.buffer, m.workers), func(b *testing.B) {
				benchDispatch(b, rate.qps, rate.burst, rate.rtt, m.buffer, m.workers)
			})
		}
	}
}

// delayed adds a round trip to every pod create it carries.
type delayed struct {
	next http.RoundTripper
	rtt  time.Duration
}

func (d delayed) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost {
		time.Sleep(d.rtt) // the network's, not a threshold's: nothing waits on the runner's clock
	}
	return d.next.RoundTrip(req)
}

func benchDispatch(b *testing.B, qps float32, burst int, rtt time.Duration, buffer, workers int) {
	c := kubetest.Current(b)
	w := lifecycle.New(pgtest.NewDB(b), lifecycle.Options{})
	ns := c.NewNamespace(b)
	clk := clock.NewFake(time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC))
	rc := c.AdminConfig()
	rc.QPS, rc.Burst = qps, burst
	if rtt > 0 {
		rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return delayed{next: rt, rtt: rtt} }
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	r, err := kuberunner.New(kuberunner.Config{Client: cs, Namespace: ns, Image: "x",
		Ladder: ladder.Defaults(), Clock: clk, DispatchBuffer: buffer, DispatchWorkers: workers}, w)
	if err != nil {
		b.Fatal(err)
	}
	tasks := benchTasks(b)
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		run := lifecycle.NewRun{RunID: fmt.Sprintf("bench-%d", i), DagID: "dag"}
		for j := range tasks {
			run.Tasks = append(run.Tasks, lifecycle.NewTask{TaskID: fmt.Sprintf("t%04d", j), Executor: "kube", Command: "true"})
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
