package scale_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

const walkSection = "walk"

// walkTimes is how many full walks are timed at each size; the median and
// the least are reported.
const walkTimes = 5

// walkProfiled is how many more walks the CPU profile records.
const walkProfiled = 3

// walkRTT is REAPER_SCALE_WALK_RTT, a round trip added to every listing
// of the board (0 when unset).
func walkRTT(b *testing.B) time.Duration {
	s := os.Getenv("REAPER_SCALE_WALK_RTT")
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		b.Fatalf("REAPER_SCALE_WALK_RTT=%q: want a duration", s)
	}
	return d
}

// farBoard is a board whose listings each wait rtt before they are sent:
// the database across a network rather than on this machine's loopback.
type farBoard struct {
	sdk.Board
	rtt time.Duration
}

func (f farBoard) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	t := time.NewTimer(f.rtt)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return sdk.CandidatePage{}, ctx.Err()
	}
	return f.Board.ListCandidates(ctx, q)
}

// walkSizes are the fleets BenchmarkScaleWalk walks: 50,000 and 150,000
// running attempts, or the comma-separated REAPER_SCALE_WALK.
func walkSizes(b *testing.B) []int {
	s := os.Getenv("REAPER_SCALE_WALK")
	if s == "" {
		return []int{50_000, 150_000}
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < ladder.PageSize {
			b.Fatalf("REAPER_SCALE_WALK=%q: want sizes of at least %d", s, ladder.PageSize)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkScaleWalk times podlost's full walk alone (section "walk"): a
// board of n healthy running kube attempts on the real PostgreSQL, and the
// kube substrate's presence cache synced over a Running pod of each, served
// by client-go's fake clientset instead of an API server. The walk asks the
// substrate only about attempts whose pods it caches Running, so it makes
// no API call either way; what the fake changes is the cost of filling the
// cache (seconds instead of the passes section's twenty minutes of KWOK),
// not the walk's. Its rules are proved elsewhere, against the real API
// server (test/kubereapers); this is a measure of time.
//
// At each size: the median and the least of five walks (each from the
// oldest row to the last, over as many passes as that takes), the
// benchmark's own CPU and PostgreSQL's over them (per walk), the machine's
// load average, and the live heap the synced substrate adds a pod (the
// fake server hands out copies that share their strings, so this is below
// what the informer holds against the real API server). REAPER_SCALE_WALK
// sets the sizes; REAPER_SCALE_WALK_RTT, a duration, is added to each
// listing's round trip (a database across a network: what reading the
// next page during the judging of this one hides); REAPER_SCALE_PROFILE, a directory, receives a CPU profile
// of three more walks at each size (walk-<size>.pprof).
func BenchmarkScaleWalk(b *testing.B) {
	for _, n := range walkSizes(b) {
		benchWalk(b, n)
	}
}

func benchWalk(b *testing.B, n int) {
	ctx := context.Background()
	bb := seedBoard(b, sdk.ExecutorKube, n)
	var board sdk.Board = bb.Store
	if rtt := walkRTT(b); rtt > 0 {
		board = farBoard{Board: bb.Store, rtt: rtt}
		progress("%s: each listing of the board %s further away", walkSection, rtt)
	}
	cs := fake.NewClientset()
	start := time.Now()
	for i, a := range massbench.Attempts(n) {
		if err := cs.Tracker().Add(runningPod("fleet", i, a)); err != nil {
			b.Fatal(err)
		}
	}
	before := liveHeap()
	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{Client: cs})
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Values: sdk.Values{"namespace": "fleet"}}); err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if ok, _ := sub.Synced(ctx); ok {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the presence cache did not sync in 5 minutes")
		}
	}
	perPod := (int64(liveHeap()) - int64(before)) / int64(n)
	waitCached(b, sub, n)
	progress("%s: %d pods in the fake server and the cache in %s", walkSection, n, time.Since(start).Round(time.Millisecond))

	walks := make([]time.Duration, walkTimes)
	pg := pgtest.Current(b).PID()
	ownBefore, pgBefore := machinecpu.Own(os.Getpid()), machinecpu.Process(pg)
	load := loadAvg()
	for i := range walks {
		walks[i] = fullWalk(b, bb, board, sub)
	}
	own, pgCPU := (machinecpu.Own(os.Getpid())-ownBefore)/walkTimes, (machinecpu.Process(pg)-pgBefore)/walkTimes
	load += " to " + loadAvg()
	slices.Sort(walks)
	med := walks[len(walks)/2]
	aimed(walkSection, "podlost full walk, "+sizeName(n)+" running, median (least)",
		fmt.Sprintf("%s (%s)", ms(med), ms(walks[0])), "< 3 s", med < fullWalkAim)
	figure(walkSection, "its CPU a walk, "+sizeName(n)+": the walk's process, PostgreSQL",
		fmt.Sprintf("%.0f ms, %.0f ms (load %s)", own*1000, pgCPU*1000, load))
	figure(walkSection, "the substrate's live heap a pod (fake server), "+sizeName(n), fmt.Sprintf("%d B", perPod))
	if dir := profileDir(b); dir != "" {
		path := filepath.Join(dir, "walk-"+sizeName(n)+".pprof")
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		var d time.Duration
		for range walkProfiled {
			d += fullWalk(b, bb, board, sub)
		}
		pprof.StopCPUProfile()
		progress("%s: %d full walks (%s) profiled in %s", walkSection, walkProfiled, ms(d), path)
	}
}

// runningPod is a Running pod of attempt a as the cache sees one of a
// runner's: the attempt's labels, the outcome finalizer, a node.
func runningPod(ns string, seq int, a sdk.Attempt) *corev1.Pod {
	l, ann := kube.AttemptLabels(a)
	started := metav1.NewTime(massbench.Now.Add(-time.Hour))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d-%d", a.RunID, kube.TaskIDLabel(a.TaskID), a.Try, a.Epoch),
			Namespace: ns, UID: types.UID(fmt.Sprintf("0b7c5e1e-6a7f-4c1e-9d7e-%012d", seq)), ResourceVersion: "1",
			Labels: l, Annotations: ann, CreationTimestamp: started, Finalizers: []string{kube.FinalizerOutcomeRecord}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: fmt.Sprintf("node-%02d", seq%50),
			Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: kube.TaskContainer, Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}}},
	}
}
