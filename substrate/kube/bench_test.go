package kube

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
)

// benchPods is how many running attempts the presence benchmark holds
// (REAPER_BENCH_PODS overrides; KWOK runs about 140 pods a second here).
func benchPods(b *testing.B, def int) int {
	if s := os.Getenv("REAPER_BENCH_PODS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return def
}

// createMany creates n pods of attempts run-<i/100>/task_<i%100>, placed
// on the env's node when placed, with 8 workers.
func (e *env) createMany(n int, placed bool) []sdk.Attempt {
	as := make([]sdk.Attempt, n)
	for i := range as {
		as[i] = sdk.Attempt{RunID: fmt.Sprintf("run-%05d", i/100), TaskID: fmt.Sprintf("task_%03d", i%100), Try: 1}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				l, ann := AttemptLabels(as[i])
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%06d", i), Labels: l, Annotations: ann},
					Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
						Containers: []corev1.Container{{Name: TaskContainer, Image: "agent"}}}}
				if placed {
					p.Spec.NodeName = e.node
				}
				if _, err := e.cs.CoreV1().Pods(e.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
	return as
}

// BenchmarkLivenessPageFromCache: one page's liveness (100 attempts) from
// the informer, with every attempt's pod Running: no API call.
func BenchmarkLivenessPageFromCache(b *testing.B) {
	e := newEnv(b)
	n := benchPods(b, 10_000)
	as := e.createMany(n, true)
	e.synced(e.sub)
	e.allRunning(n)
	page := as[n/2 : n/2+100]
	e.calls.reset()
	for b.Loop() {
		for _, l := range liveness(b, e.sub, false, page...) {
			if l.State != sdk.Alive {
				b.Fatalf("%+v", l)
			}
		}
	}
	if c := e.calls.total(); c != 0 {
		b.Fatalf("%d API calls (%s), want 0", c, e.calls)
	}
	b.ReportMetric(0, "calls/page")
}

// BenchmarkLivenessPageOfMisses: a page of 100 attempts none of which has a
// pod, read live.
func BenchmarkLivenessPageOfMisses(b *testing.B) {
	e := newEnv(b)
	e.synced(e.sub)
	as := make([]sdk.Attempt, 100)
	for i := range as {
		as[i] = sdk.Attempt{RunID: fmt.Sprintf("run-%03d-0123456789abcdef0123456789abcdef", i), TaskID: fmt.Sprintf("task_%03d", i), Try: 1}
	}
	e.calls.reset()
	pages := 0
	for b.Loop() {
		liveness(b, e.sub, false, as...)
		pages++
	}
	b.ReportMetric(float64(e.calls.total())/float64(pages), "calls/page")
}

// BenchmarkMassTeardown: tear down 1,000 running attempts, one request
// each as reapers make them (a LIST and a PATCH), at the default QPS and
// burst.
func BenchmarkMassTeardown(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		e := newEnv(b)
		n := benchPods(b, 1000)
		as := e.createMany(n, true)
		e.synced(e.sub)
		e.allRunning(n)
		b.StartTimer()
		start := time.Now()
		for _, a := range as {
			out := teardown(b, e.sub, sdk.TeardownRequest{Attempt: &a})
			if out[0].Action != sdk.TeardownStoppedInPlace {
				b.Fatalf("%+v", out)
			}
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/teardown")
	}
}

// allRunning waits until the cache holds n Running pods.
func (e *env) allRunning(n int) {
	r, _ := e.sub.current()
	e.waitWithin(10*time.Minute, fmt.Sprintf("%d pods Running in the cache", n), func() bool {
		running := 0
		for _, p := range r.presence.snapshot() {
			if p.phase == corev1.PodRunning {
				running++
			}
		}
		return running == n
	})
}
