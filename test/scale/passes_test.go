package scale_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The section's aims (issue #30, tightened by issue #44).
const (
	steadyAim   = 50 * time.Millisecond // one steady pass of every reaper of an edition
	fullWalkAim = 3 * time.Second       // one full podlost walk
	podBytesAim = 900                   // the informer's bytes per pod
)

// passSizes are the fleets the section measures, smallest first (each
// edition grows one fleet through them): 10,000, 50,000 and 150,000
// running attempts, or the comma-separated REAPER_SCALE_PASSES.
func passSizes(b *testing.B) []int {
	s := os.Getenv("REAPER_SCALE_PASSES")
	if s == "" {
		return []int{10_000, 50_000, 150_000}
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < ladder.PageSize || (len(out) > 0 && n <= out[len(out)-1]) {
			b.Fatalf("REAPER_SCALE_PASSES=%q: want growing sizes of at least %d", s, ladder.PageSize)
		}
		out = append(out, n)
	}
	return out
}

// steadyPasses is how many steady passes are timed at each size; the
// median is reported.
const steadyPasses = 7

// BenchmarkScalePasses measures the reap passes over 10,000, 50,000 and
// 150,000 healthy running attempts, each edition (section "passes"):
//
//   - Lite: a board of healthy running Lite attempts (fresh heartbeats)
//     and a record directory holding the records of every one of them, as
//     their agents would have written them. What is modelled: the records
//     name two real long-lived processes (an agent and the leader of its
//     task group), shared by every record, rather than 150,000 agents and
//     groups, which one machine cannot run. That is fair for the steady
//     pass because no healthy attempt is probed (a Lite reaper lists only
//     the silent or unstarted ones), so what the records cost it is their
//     presence in the directory; and fair for the probe figure because the
//     batch's per-process facts are read once per process either way, so
//     what grows with the directory, the record lookup, is what is timed.
//     (Measured here, the probe costs about the same with 150,000
//     attempts' records in the one directory as with 10,000: the
//     directory is not sharded.)
//   - Kube: the real API server, etcd and KWOK (testkit/kubetest), one pod
//     per attempt created through the API and run by KWOK, the fleet grown
//     10k -> 50k -> 150k on one cluster; the kube substrate in process
//     with its requests counted at its transport (watches aside: the
//     informer's own).
//
// At each size: the median of seven steady passes of every reaper of the
// edition (each reaper's state carried from pass to pass, as the host
// does; the first pass, podlost's full walk on kube, is not counted), and
// the API calls they made. Kube also: one full podlost walk, timed to the
// end of the walk whatever the passes it took; at the largest size, the
// informer's live bytes per pod (a fresh substrate synced over the whole
// fleet), and a relist after an API outage (the API server killed and
// started again: the watch cannot resume, the informer lists again),
// reporting the peak heap over its steady peak and the longest cycle of
// every reaper while the informer relisted, held to the cycle's budget.
//
// Two variables help while working on a pass: REAPER_SCALE_EDITIONS
// ("lite", "kube" or both, comma-separated; both by default) and
// REAPER_SCALE_PROFILE, a directory that receives a CPU profile of 10 s of
// kube steady passes and of one more full walk at each size
// (kube-steady-<size>.pprof, kube-walk-<size>.pprof) and a heap profile of
// the informer's cache at the largest (kube-informer-<size>.pprof).
func BenchmarkScalePasses(b *testing.B) {
	sizes := passSizes(b)
	eds := editions(b)
	if eds[ladder.EditionLite] {
		benchLitePasses(b, sizes)
	}
	if eds[ladder.EditionKube] {
		benchKubePasses(b, sizes)
	}
}

// editions are the editions REAPER_SCALE_EDITIONS names (both when unset).
func editions(b *testing.B) map[string]bool {
	s := os.Getenv("REAPER_SCALE_EDITIONS")
	if s == "" {
		return map[string]bool{ladder.EditionLite: true, ladder.EditionKube: true}
	}
	out := map[string]bool{}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e != ladder.EditionLite && e != ladder.EditionKube {
			b.Fatalf("REAPER_SCALE_EDITIONS=%q: want %q, %q or both", s, ladder.EditionLite, ladder.EditionKube)
		}
		out[e] = true
	}
	return out
}

// profileDir is REAPER_SCALE_PROFILE: where profiles go ("" for none).
func profileDir(b *testing.B) string {
	d := os.Getenv("REAPER_SCALE_PROFILE")
	if d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatalf("REAPER_SCALE_PROFILE: %v", err)
		}
	}
	return d
}

// loadAvg is the machine's one-minute load average, as /proc/loadavg
// says it ("?" where there is none).
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

const section = "passes"

func sizeName(n int) string {
	if n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// reapers returns the edition's reapers, in the order of its
// configuration, each configured with its defaults.
func reapers(b *testing.B, edition string) []sdk.Reaper {
	rs := []sdk.Reaper{dispatchlost.New(nil), agentlost.New(nil), orphanrun.New(nil)}
	if edition == ladder.EditionKube {
		rs = []sdk.Reaper{dispatchlost.New(nil), podlost.New(nil), agentlost.New(nil), warmworker.New(nil), orphanrun.New(nil)}
	}
	for _, r := range rs {
		configure(b, edition, r, nil)
	}
	return rs
}

// configure configures r with its defaults and values over them.
func configure(b *testing.B, edition string, r sdk.Reaper, values sdk.Values) {
	ctx := context.Background()
	schema, err := r.ConfigSchema(ctx)
	if err != nil {
		b.Fatal(err)
	}
	v := schema.WithDefaults(nil)
	for k, x := range values {
		v[k] = x
	}
	if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: edition, Ladder: ladder.Defaults(), Values: v}); err != nil {
		b.Fatal(err)
	}
}

// cycle is the reapers of an edition over one board and substrate, each
// one's pass state carried into its next pass as the host carries it.
type cycle struct {
	edition string
	rs      []sdk.Reaper
	board   *massbench.Board
	exec    sdk.Executions
	states  [][]byte
	// slowest names the slowest reaper of the last pass, and its time.
	slowest string
	// took is each reaper's time in the last pass.
	took []time.Duration
}

func newCycle(b *testing.B, edition string, board *massbench.Board, exec sdk.Executions) *cycle {
	rs := reapers(b, edition)
	return &cycle{edition: edition, rs: rs, board: board, exec: exec, states: make([][]byte, len(rs)),
		took: make([]time.Duration, len(rs))}
}

// pass runs one pass of every reaper at massbench.Now, fails on any
// decision (the board is healthy), and returns how long it took.
func (c *cycle) pass(b *testing.B) time.Duration {
	l := ladder.Defaults()
	start := time.Now()
	var most time.Duration
	for i, r := range c.rs {
		var sink sdk.Collector
		began := time.Now()
		res, err := r.Reap(context.Background(), sdk.Pass{Now: massbench.Now, Ladder: l, Term: c.board.Term,
			Deadline: massbench.Now.Add(l.MaintenanceInterval), Edition: c.edition, State: c.states[i]}, c.board.Store, c.exec, &sink)
		if err != nil {
			b.Fatal(err)
		}
		c.states[i] = res.State
		if ds := sink.Decisions(); len(ds) != 0 {
			b.Fatalf("a healthy board gave %d decisions, the first %+v", len(ds), ds[0])
		}
		d := time.Since(began)
		c.took[i] = d
		if d > most {
			info, _ := r.Info(context.Background())
			most, c.slowest = d, info.Name+" "+ms(d)
		}
	}
	return time.Since(start)
}

// steady runs the passes timed at one size and returns their median.
func (c *cycle) steady(b *testing.B) time.Duration {
	d, _ := c.steadyParts(b)
	return d
}

// steadyParts is steady, also returning each reaper's median and the
// share of the process's CPU the garbage collector took meanwhile:
// "dispatchlost 0.2 ms, podlost 3.1 ms, ..., GC 12%".
func (c *cycle) steadyParts(b *testing.B) (time.Duration, string) {
	times := make([]time.Duration, steadyPasses)
	per := make([][]time.Duration, len(c.rs))
	cpu := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}
	metrics.Read(cpu)
	gc0, all0 := cpu[0].Value.Float64(), cpu[1].Value.Float64()
	for i := range times {
		times[i] = c.pass(b)
		for k, d := range c.took {
			per[k] = append(per[k], d)
		}
	}
	metrics.Read(cpu)
	slices.Sort(times)
	var parts []string
	for k, r := range c.rs {
		info, _ := r.Info(context.Background())
		slices.Sort(per[k])
		parts = append(parts, info.Name+" "+ms(per[k][len(per[k])/2]))
	}
	// The runtime's CPU classes are estimates refreshed at each GC; over
	// a few passes the share is indicative, not exact.
	if all := cpu[1].Value.Float64() - all0; all > 0 {
		parts = append(parts, fmt.Sprintf("GC %.0f%%", 100*(cpu[0].Value.Float64()-gc0)/all))
	}
	return times[len(times)/2], strings.Join(parts, ", ")
}

// profileSteady writes a CPU profile of dur of steady passes to path.
func (c *cycle) profileSteady(b *testing.B, path string, dur time.Duration) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	passes := 0
	for start := time.Now(); time.Since(start) < dur; passes++ {
		c.pass(b)
	}
	pprof.StopCPUProfile()
	progress("passes: %d steady passes profiled in %s", passes, path)
}

// seedBoard is a fresh board of n healthy running attempts of executor.
func seedBoard(b *testing.B, executor string, n int) *massbench.Board {
	ctx := context.Background()
	bb, err := massbench.NewBoard(ctx, pgtest.NewDB(b))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := bb.SeedRunningOn(ctx, executor, n, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	progress("passes: %s board of %d running attempts seeded in %s", executor, n, time.Since(start).Round(time.Millisecond))
	return bb
}

// ---- Lite -----------------------------------------------------------------

func benchLitePasses(b *testing.B, sizes []int) {
	ctx := context.Background()
	dir := filepath.Join(b.TempDir(), "records")
	sub, err := massbench.NewLite(ctx, dir)
	if err != nil {
		b.Fatal(err)
	}
	agent, leader := longLived(b, false), longLived(b, true)
	have := 0
	for _, n := range sizes {
		start := time.Now()
		writeLiveRecords(b, sub.Records(), massbench.Attempts(n)[have:], agent, leader)
		progress("passes: lite records of %d attempts in the directory (%d written in %s)", n, n-have,
			time.Since(start).Round(time.Millisecond))
		have = n
		c := newCycle(b, ladder.EditionLite, seedBoard(b, sdk.ExecutorLite, n), sub)
		c.pass(b)
		d := c.steady(b)
		aimed(section, "lite steady pass, "+sizeName(n)+" running", ms(d), "< 50 ms", d < steadyAim)
		figure(section, "lite probe per attempt, "+sizeName(n)+" records", probeCost(b, sub.Records(), n))
	}
}

// longLived starts a process that runs until the benchmark ends (a group
// leader of its own when leads) and returns what its records name.
func longLived(b *testing.B, leads bool) proc.Info {
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: leads}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	info, err := proc.Stat(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	return info
}

// writeLiveRecords writes the agent and group records of every attempt,
// naming agent and the group leader, on a few goroutines.
func writeLiveRecords(b *testing.B, dir *records.Dir, as []sdk.Attempt, agent, leader proc.Info) {
	boot, _ := proc.BootID()
	err := massbench.Each(len(as), 4, func(i int) error {
		a := as[i]
		if err := dir.WriteAgent(records.AgentRecord{Attempt: a, PID: agent.PID, Start: agent.Start, Boot: boot}); err != nil {
			return err
		}
		return dir.WriteGroup(records.GroupRecord{Attempt: a, PGID: leader.PID, AgentPID: agent.PID,
			AgentStart: agent.Start, LeaderStart: leader.Start, Boot: boot})
	})
	if err != nil {
		b.Fatal(err)
	}
}

// probeCost times the probe of 1,000 attempts spread over the n whose
// records are in the directory, every one alive, and returns the median
// cost per attempt of five batches, and the least.
func probeCost(b *testing.B, dir *records.Dir, n int) string {
	all := massbench.Attempts(n)
	batch := make([]sdk.Attempt, 1000)
	for i := range batch {
		batch[i] = all[i*n/len(batch)]
	}
	times := make([]time.Duration, 5)
	for k := range times {
		start := time.Now()
		got, err := lite.Probe(context.Background(), dir, batch, nil)
		times[k] = time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range got {
			if l.State != sdk.Alive {
				b.Fatalf("a live attempt probed %s: %s", l.State, l.Detail)
			}
		}
	}
	slices.Sort(times)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(len(batch)) / 1000 }
	return fmt.Sprintf("%.1f µs (min %.1f)", per(times[2]), per(times[0]))
}

// ---- Kube -----------------------------------------------------------------

// podWorkers is how many goroutines create the fleet's pods.
const podWorkers = 32

// calls counts the requests of a client, the watches aside (the
// informer's own, renewed on the server's schedule).
type calls struct{ n atomic.Int64 }

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *calls) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.URL.Query().Get("watch") != "true" {
			c.n.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

// kubeFleet is the test cluster, one namespace and KWOK node of it, and
// the pods made so far.
type kubeFleet struct {
	c    *kubetest.Cluster
	ns   string
	node string
	fast kubernetes.Interface
	pods int
}

func startKubeFleet(b *testing.B) *kubeFleet {
	ctx := context.Background()
	start := time.Now()
	c, err := kubetest.Start(ctx, kubetest.Options{NoControllerManager: true, Build: kubetest.BuildOptions{Progress: os.Stderr}})
	if err != nil {
		b.Fatalf("starting the test cluster: %v", err)
	}
	b.Cleanup(func() {
		if err := c.Stop(); err != nil {
			b.Error(err)
		}
	})
	rc := c.AdminConfig()
	rc.QPS, rc.Burst = 5000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf" // the cheaper decode for the API server
	fast, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	f := &kubeFleet{c: c, ns: c.NewNamespace(b), node: c.AddNode(b, "").Name, fast: fast}
	progress("passes: test cluster up in %s", time.Since(start).Round(time.Millisecond))
	return f
}

func podName(a sdk.Attempt) string {
	return strings.ToLower(a.RunID + "-" + kube.TaskIDLabel(a.TaskID))
}

// grow creates the pods of the attempts up to n on the KWOK node, as the
// kube runner makes them, and waits until KWOK runs them all.
func (f *kubeFleet) grow(b *testing.B, n int) {
	ctx := context.Background()
	as := massbench.Attempts(n)[f.pods:]
	start := time.Now()
	var made atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				progress("passes: %d of %d pods created", f.pods+int(made.Load()), n)
			}
		}
	})
	err := massbench.Each(len(as), podWorkers, func(i int) error {
		l, ann := kube.AttemptLabels(as[i])
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(as[i]), Labels: l, Annotations: ann,
			Finalizers: []string{kube.FinalizerOutcomeRecord}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: f.node,
				Containers: []corev1.Container{{Name: kube.TaskContainer, Image: "agent"}}}}
		_, err := f.fast.CoreV1().Pods(f.ns).Create(ctx, p, metav1.CreateOptions{})
		made.Add(1)
		return err
	})
	close(stop)
	wg.Wait()
	if err != nil {
		b.Fatalf("creating pods: %v", err)
	}
	created := time.Since(start)
	f.pods = n
	progress("passes: %d pods created in %s (%.0f/s, %d at a time)", len(as), created.Round(time.Millisecond),
		float64(len(as))/created.Seconds(), podWorkers)
	ran := time.Now()
	// Polled every 5s: each look filters the whole fleet in the API
	// server, which is what bounds the creates and KWOK's updates here.
	for last := time.Now(); ; time.Sleep(5 * time.Second) {
		left, err := f.notRunning(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Since(ran) > 30*time.Minute {
			b.Fatalf("KWOK left pods not Running after %s", time.Since(ran).Round(time.Second))
		}
		if time.Since(last) > 30*time.Second {
			progress("passes: waiting for KWOK to run the pods (some are not Running yet, %s after the creates)", time.Since(ran).Round(time.Second))
			last = time.Now()
		}
	}
	progress("passes: all %d pods Running %s after the creates", n, time.Since(ran).Round(time.Second))
}

// notRunning is 0 when every pod of the namespace is Running, else at
// least 1: one page of the pods that are not, served by the API server's
// cache.
func (f *kubeFleet) notRunning(ctx context.Context) (int, error) {
	l, err := f.fast.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running", Limit: 1})
	if err != nil {
		return 0, fmt.Errorf("listing the pods not Running: %w", err)
	}
	return len(l.Items), nil
}

// substrate configures a kube substrate on the fleet's namespace, its
// requests counted, and waits for its cache to sync.
func (f *kubeFleet) substrate(b *testing.B) (*kube.Substrate, *calls) {
	ctx := context.Background()
	cs := &calls{}
	rc := f.c.AdminConfig()
	rc.Wrap(cs.wrap)
	sub := kube.NewWithOptions(hclog.NewNullLogger(), kube.Options{RestConfig: rc})
	if err := sub.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionKube, Values: sdk.Values{"namespace": f.ns}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sub.Close)
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if ok, _ := sub.Synced(ctx); ok {
			return sub, cs
		}
		if time.Now().After(deadline) {
			b.Fatal("the presence cache did not sync in 5 minutes")
		}
	}
}

func benchKubePasses(b *testing.B, sizes []int) {
	f := startKubeFleet(b)
	var sub *kube.Substrate
	var cs *calls
	for k, n := range sizes {
		f.grow(b, n)
		if sub == nil {
			sub, cs = f.substrate(b)
		}
		waitCached(b, sub, n)
		c := newCycle(b, ladder.EditionKube, seedBoard(b, sdk.ExecutorKube, n), sub)
		first := c.pass(b)
		progress("passes: kube first pass (podlost's full walk) at %d: %s", n, ms(first))
		cs.n.Store(0)
		d, parts := c.steadyParts(b)
		api := cs.n.Load()
		aimed(section, "kube steady pass, "+sizeName(n)+" running", ms(d), "< 50 ms", d < steadyAim)
		aimed(section, "kube steady pass API calls, "+sizeName(n), strconv.FormatInt(api/steadyPasses, 10), "0", api == 0)
		figure(section, "kube steady pass by part, "+sizeName(n), parts+", load "+loadAvg())
		if dir := profileDir(b); dir != "" {
			c.profileSteady(b, filepath.Join(dir, "kube-steady-"+sizeName(n)+".pprof"), 10*time.Second)
		}
		walk := fullWalk(b, c.board, c.board.Store, sub)
		aimed(section, "podlost full walk, "+sizeName(n)+" running", ms(walk), "< 3 s", walk < fullWalkAim)
		if dir := profileDir(b); dir != "" {
			profileWalk(b, filepath.Join(dir, "kube-walk-"+sizeName(n)+".pprof"), c.board, sub)
		}
		if k == len(sizes)-1 {
			podBytes(b, f, n)
			relist(b, f, c, sub, n)
		}
	}
}

// waitCached waits until the substrate answers every one of the first n
// attempts alive from its cache.
func waitCached(b *testing.B, sub *kube.Substrate, n int) {
	ctx := context.Background()
	as := massbench.Attempts(n)
	start := time.Now()
	for {
		cached := 0
		for i := 0; i < n; i += ladder.PageSize {
			got, err := sub.Liveness(ctx, sdk.LivenessRequest{Attempts: as[i:min(i+ladder.PageSize, n)]})
			if err != nil {
				b.Fatal(err)
			}
			for _, l := range got {
				if l.State == sdk.Alive && strings.HasPrefix(l.Detail, "cached") {
					cached++
				}
			}
		}
		if cached == n {
			return
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("the cache answers %d of %d attempts after 5 minutes", cached, n)
		}
		time.Sleep(time.Second)
	}
}

// fullWalk times a podlost that walks every running attempt each pass,
// from its first page to its last, over as many passes as that takes.
func fullWalk(b *testing.B, mb *massbench.Board, board sdk.Board, sub *kube.Substrate) time.Duration {
	r := podlost.New(nil)
	configure(b, ladder.EditionKube, r, sdk.Values{"full_walk_every": "0s"})
	l := ladder.Defaults()
	var state []byte
	start := time.Now()
	for passes := 1; ; passes++ {
		var sink sdk.Collector
		res, err := r.Reap(context.Background(), sdk.Pass{Now: massbench.Now, Ladder: l, Term: mb.Term,
			Deadline: massbench.Now.Add(l.MaintenanceInterval), Edition: ladder.EditionKube, State: state}, board, sub, &sink)
		if err != nil {
			b.Fatal(err)
		}
		if ds := sink.Decisions(); len(ds) != 0 {
			b.Fatalf("a healthy board gave %d decisions, the first %+v", len(ds), ds[0])
		}
		state = res.State
		st, err := reap.DecodeState(state)
		if err != nil {
			b.Fatal(err)
		}
		if _, walking := st.Cursors["running"]; !walking {
			if passes > 1 {
				progress("passes: the full walk took %d passes", passes)
			}
			return time.Since(start)
		}
	}
}

// profileWalk writes a CPU profile of one more full walk to path.
func profileWalk(b *testing.B, path string, board *massbench.Board, sub *kube.Substrate) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	d := fullWalk(b, board, board.Store, sub)
	pprof.StopCPUProfile()
	progress("passes: a full walk (%s) profiled in %s", ms(d), path)
}

// heapObjects reads the bytes of the heap's objects, live or not yet
// swept: the heap's size as the process holds it.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// liveHeap is the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// podBytes measures what a fresh substrate's synced cache holds per pod
// over the fleet of n (the heap it adds, once collected), as
// BenchmarkCacheMemory measures it against a fake clientset.
func podBytes(b *testing.B, f *kubeFleet, n int) {
	before := liveHeap()
	sub, _ := f.substrate(b)
	after := liveHeap()
	per := float64(after-before) / float64(n)
	aimed(section, "informer bytes per pod, "+sizeName(n)+" pods", fmt.Sprintf("%.0f B", per), "< 900 B", per < podBytesAim)
	if dir := profileDir(b); dir != "" {
		f, err := os.Create(filepath.Join(dir, "kube-informer-"+sizeName(n)+".pprof"))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
	sub.Close()
}

// sampler keeps the largest heap it sees, sampling every 10 ms.
type sampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func sample() *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if h := heapObjects(); h > s.peak.Load() {
				s.peak.Store(h)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) end() uint64 {
	close(s.stop)
	<-s.done
	return s.peak.Load()
}

// relist kills the API server under the steady fleet of n, compacts etcd
// (as an outage longer than the API server's compaction interval would
// find it) and starts the API server again, so that the informer's watch
// cannot resume and it lists the pods afresh, while the cycle goes on: every reaper's pass back to back. It
// reports the peak heap over the peak of the steady cycles before it, and
// the longest cycle from the outage until relistWindow after the informer
// began its list (the list, its replacing the cache, and podlost's full
// walk that follows a break in the change feed all fall within it).
func relist(b *testing.B, f *kubeFleet, c *cycle, sub *kube.Substrate, n int) {
	ctx := context.Background()
	now, err := sub.Changes(ctx, sdk.FeedCursor{})
	if err != nil {
		b.Fatal(err)
	}
	gen := now.Cursor.Generation
	s := sample()
	for start := time.Now(); time.Since(start) < 20*time.Second; {
		c.pass(b)
	}
	steady := s.end()

	s = sample()
	outage := time.Now()
	if err := f.c.StopAPIServer(); err != nil {
		b.Fatal(err)
	}
	var (
		longest      time.Duration
		slowest      string
		back, listed time.Time
	)
	cycle := func() {
		if d := c.pass(b); d > longest {
			longest, slowest = d, c.slowest
		}
	}
	for time.Since(outage) < 5*time.Second {
		cycle()
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := f.c.CompactEtcd(sctx); err != nil {
		b.Fatal(err)
	}
	// The cycle goes on while the API server starts (with the whole fleet
	// in etcd, that takes a while).
	started := make(chan error, 1)
	go func() { started <- f.c.StartAPIServer(sctx) }()
	for listed.IsZero() || time.Since(listed) < relistWindow {
		cycle()
		select {
		case err := <-started:
			if err != nil {
				b.Fatal(err)
			}
			back = time.Now()
			progress("passes: the API server was out for %s", back.Sub(outage).Round(time.Millisecond))
		default:
		}
		if !back.IsZero() && listed.IsZero() && relisted(b, sub, gen) {
			listed = time.Now()
			progress("passes: the informer began its relist %s after the API server's return", listed.Sub(back).Round(time.Millisecond))
		}
		if !back.IsZero() && time.Since(back) > 3*time.Minute {
			b.Fatal("the informer did not relist within 3 minutes of the API server's return")
		}
	}
	progress("passes: the longest cycle's slowest reaper: %s", slowest)
	peak := s.end()
	waitCached(b, sub, n)
	ratio := float64(peak) / float64(steady)
	aimed(section, "relist at "+sizeName(n)+": peak heap over the steady peak",
		fmt.Sprintf("%.2fx (%d MiB / %d MiB)", ratio, peak>>20, steady>>20), "< 2x", ratio < 2)
	budget := ladder.Defaults().MaintenanceInterval // a cycle's budget
	aimed(section, "relist at "+sizeName(n)+": longest cycle", ms(longest), "< "+budget.String()+" (the cycle's budget)", longest < budget)
}

// relistWindow is how long the relist is watched after the informer began
// its list.
const relistWindow = 30 * time.Second

// relisted reports whether the presence cache's view began again since
// generation gen of its change feed by listing the pods afresh (a list or
// a watch-list; not merely a lost watch).
func relisted(b *testing.B, sub *kube.Substrate, gen string) bool {
	ch, err := sub.Changes(context.Background(), sdk.FeedCursor{Generation: gen})
	if err != nil {
		b.Fatal(err)
	}
	return ch.Cursor.Generation != gen && strings.Contains(ch.Detail, "listed the pods afresh")
}
