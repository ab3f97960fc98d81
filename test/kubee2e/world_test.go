package kubee2e_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/cmd/reaperctl/ctl"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
	"github.com/dexaflow/reaper/testkit/marked"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The ladder of every scenario: the specification's order, shortened so a
// scenario takes tens of seconds.
const (
	interval     = 2 * time.Second
	lease        = 3 * time.Second
	heartbeat    = time.Second
	agentLost    = 5 * time.Second
	grace        = 8 * time.Second
	dispatchLost = 10 * time.Second
	podLostFloor = 5 * time.Second
	orphanRun    = 20 * time.Second
	valve        = 10 * time.Second
	podGrace     = 2 * time.Second // task_termination_grace: the task pods' grace
	runnerTick   = 500 * time.Millisecond
	// apiTimeout bounds each request of the harness's own.
	apiTimeout = 5 * time.Second
)

// markEnv marks every process of a scenario: reaperd passes it to its
// plugins, the player to the agents, the agents to the tasks.
const markEnv = "REAPER_KUBEE2E_SCENARIO"

// runID is the one run each scenario submits.
const runID = "kubee2e"

// kubeReapers are the five reapers of the kube edition.
const kubeReapers = `reaper "dispatchlost" {}
reaper "podlost" {}
reaper "agentlost" {}
reaper "warmworker" {}
reaper "orphanrun" {}
`

// taskSpec is one task of a scenario's run and the end it must reach.
type taskSpec struct {
	id string
	// victim: the first attempt (try 1, epoch 0 of the runner's first
	// dispatch) waits for the release like a bystander, so only the
	// harm ends it; every later attempt ends after a second.
	victim bool
	// want is the task's final state (default success); try its final
	// try (default 1); replaced: its final epoch is above the first.
	want     string
	try      int32
	replaced bool
	// harm, on the real node, is the victim's first execution's body
	// instead of the wait (the fault the task does to itself).
	harm string
	// upstreams are the tasks of the run it waits for; gate, when set,
	// names the file in the task directory it waits for instead of the
	// release (the scenario releases it alone).
	upstreams []string
	gate      string
	// lost: its first execution may be lost with a failover's window (it
	// ran on a primary whose writes the promoted board never had), so it
	// may run twice, one after the other, never at once.
	lost bool
}

func bystander(id string) taskSpec { return taskSpec{id: id} }

// victim is a task whose first pod the scenario harms: it must end
// successful on a new epoch, on the infra rail (no retry spent).
func victim(id string) taskSpec { return taskSpec{id: id, victim: true, replaced: true} }

// scenario is one fault scenario: its namespace and node on the shared
// cluster (or a cluster of its own), its database, its reaperd replicas,
// the kubelet player running its pods' agents, the faults it injected and
// its line of figures.
type scenario struct {
	t     *testing.T
	num   int
	title string
	row   *figures
	mark  string

	c       *kubetest.Cluster
	cs      kubernetes.Interface
	ns      string
	player  *kubelet.Player
	workers *kubelet.Player  // the warm pool's
	binder  *kubetest.Binder // places pods on the newest node
	stopBg  context.CancelFunc

	dir, taskDir, release, apiListen, dsn string
	retries                               int
	noRunner                              bool  // the scheduler is gone: replicas start without the runner
	infraBudget                           int32 // the tasks' (0: the default)
	warmPool                              int   // the runner's warm pool size (0: none)
	executor                              string
	pool                                  *pgxpool.Pool
	store                                 *board.Store

	daemons []*daemon
	tasks   []taskSpec
	faults  []*fault
	harmed  map[sdk.Attempt]bool
	runHarm bool // the run itself may be reaped (orphan run)
	terms   map[int64]time.Time
	started time.Time

	// On the real node (newRealScenario): the node, the ledger the tasks
	// report their executions to over the pod network, and the task
	// container's memory limit ("" for none).
	real     *kubetest.RealNode
	ledger   *ledger
	memLimit string
	// valveOver and orphanOver, when set, replace the ladder's
	// infra_confirm_valve and orphan_run (a scenario that needs the valve
	// past the cluster's node monitor grace).
	valveOver, orphanOver time.Duration

	// gone establishes, on the player's tier, when an execution killed
	// without its end line ended (history_test.go).
	gone *goneWatch
}

// newScenario prepares a scenario on cluster c: a namespace with one node,
// a database, the binder and the player.
func newScenario(t *testing.T, num int, title string, c *kubetest.Cluster) *scenario {
	t.Helper()
	return newScenarioOn(t, num, title, c, nil)
}

// newScenarioOn is newScenario; with real set, the scenario's pods run on
// the real node (no player: its kubelet runs them) and its tasks report
// their executions to a ledger (see newRealScenario).
func newScenarioOn(t *testing.T, num int, title string, c *kubetest.Cluster, real *kubetest.RealNode) *scenario {
	t.Helper()
	return newScenarioBoard(t, num, title, c, real, "")
}

// newScenarioBoard is newScenarioOn on the board dsn names ("": a database
// of its own on the suite's PostgreSQL): a board of the scenario's own
// server, or of a primary and its standby (their failover DSN).
func newScenarioBoard(t *testing.T, num int, title string, c *kubetest.Cluster, real *kubetest.RealNode, dsn string) *scenario {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &scenario{t: t, num: num, title: title, c: c, cs: c.Client(t), ns: c.NewNamespace(t),
		mark: fmt.Sprintf("k%d-%s", num, hex.EncodeToString(b[:])), dir: t.TempDir(),
		harmed: map[sdk.Attempt]bool{}, terms: map[int64]time.Time{}, started: time.Now(), real: real}
	if err := kubetest.CreateServiceAccount(context.Background(), s.cs, s.ns, kuberunner.ServiceAccountDefault); err != nil {
		t.Fatal(err)
	}
	s.row = book.add(num, title)
	s.row.track(t)
	s.taskDir = filepath.Join(s.dir, "tasks")
	s.release = filepath.Join(s.dir, "release")
	if err := os.Mkdir(s.taskDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if real != nil {
		s.apiListen = freeAddrOn(t, kubetest.NodeGateway)
		s.ledger = startLedger(t, s.taskDir, s.release)
	} else {
		s.apiListen = attemptapitest.FreeAddr(t)
	}
	s.dsn = dsn
	if s.dsn == "" {
		s.dsn = pgtest.NewDSN(t)
	}
	var err error
	if s.pool, err = pgxpool.New(context.Background(), s.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.pool.Close)
	s.store = board.New(s.pool, board.Options{})
	s.installHistory()
	if real == nil {
		s.gone = startGoneWatch(t, s.taskDir)
	}

	bg, stop := context.WithCancel(context.Background())
	s.stopBg = stop
	if s.binder, err = kubetest.StartBinder(bg, kubetest.BinderConfig{Client: s.cs, Namespace: s.ns,
		Timeout: apiTimeout}); err != nil {
		t.Fatal(err)
	}
	if real != nil {
		s.binder.AddNode(real.Name)
		t.Cleanup(func() {
			s.binder.Stop()
			stop()
			s.sweep()
		})
		t.Cleanup(func() {
			if t.Failed() {
				s.dump()
			}
		})
		return s
	}
	s.addNode()
	logf, err := os.Create(filepath.Join(s.dir, "player.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Every pod the runner makes carries the run label: one player runs
	// them all. The warm pool's workers carry the pool's label, not a
	// run's: a second player runs them.
	play := func(name, selector string) *kubelet.Player {
		p, err := kubelet.Start(bg, kubelet.Config{Client: s.cs, Namespace: s.ns, Dir: filepath.Join(s.dir, name),
			Selector: selector, Commands: map[string]string{"reaper-agent": filepath.Join(binDir, "reaper-agent")},
			Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), markEnv + "=" + s.mark}, MaxGrace: podGrace,
			Logger: hclog.New(&hclog.LoggerOptions{Name: name, Output: logf, Level: hclog.Debug})})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	s.player, s.workers = play("containers", kube.LabelRunID), play("workers", kube.LabelWarmPool)
	// Cleanups run last registered first: the daemons' (registered later)
	// stop before the player and the binder; nothing marked outlives it.
	t.Cleanup(func() {
		s.player.Stop()
		s.workers.Stop()
		s.binder.Stop()
		stop()
		_ = logf.Close()
		s.sweep()
	})
	t.Cleanup(func() {
		if t.Failed() {
			s.dump()
		}
	})
	return s
}

// addNode adds a KWOK node the binder places the scenario's new pods on.
func (s *scenario) addNode() string {
	s.t.Helper()
	n := s.c.AddNode(s.t, "").Name
	s.binder.AddNode(n)
	return n
}

// config writes the kube edition's configuration (the Kubernetes Lease,
// the suite's ladder, the kube substrate, the kube runner, the five
// reapers) and returns its path. With noRunner set (a scheduler gone, the
// reapers left), the replicas started from then on run no runner.
func (s *scenario) config() string {
	s.t.Helper()
	name, runner := "reaperd.hcl", runnerBlock(runnerTick)
	if s.warmPool > 0 {
		runner = strings.Replace(runner, "  kube {\n", fmt.Sprintf("  kube {\n    warm_pool {\n      size = %d\n      poll = \"200ms\"\n    }\n", s.warmPool), 1)
	}
	if s.real != nil {
		runner = realRunnerBlock(runnerTick, s.apiListen, s.memLimit)
	}
	if s.noRunner {
		name, runner = "reaperd-no-runner.hcl", ""
	}
	path := filepath.Join(s.dir, name)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	leader := fmt.Sprintf(`leader "kubernetes" {
  namespace  = %q
  name       = "reaperd"
  kubeconfig = %q
  lease      = %q
}

maintenance {
  interval = %q
}

ladder {
  heartbeat              = %q
  agent_lost             = %q
  settling_grace         = %q
  dispatch_lost          = %q
  pod_lost_floor         = %q
  orphan_run             = %q
  infra_confirm_valve    = %q
  task_termination_grace = %q
}`, s.ns, s.c.Kubeconfig(), lease, interval, heartbeat, agentLost, grace, dispatchLost, podLostFloor,
		cmp.Or(s.orphanOver, orphanRun), cmp.Or(s.valveOver, valve), podGrace)
	if err := os.WriteFile(path, []byte(s.configText(leader, s.apiListen, runner)), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// configText is a kube edition configuration on the scenario's board and
// namespace: leader holds the leader block (and any ladder), runner the
// runner block ("" for none).
func (s *scenario) configText(leader, apiListen, runner string) string {
	return fmt.Sprintf(`edition    = "kube"
plugin_dir = %q

store {
  dsn = %q
}

%s

telemetry {
  listen = "127.0.0.1:0"
}

attempt_api {
  listen    = %q
  state_dir = %q
%s}

substrate "kube" {
  namespace  = %q
  kubeconfig = %q
}

%s

%s`, binDir, s.dsn, leader, apiListen, filepath.Join(s.dir, "attempt-api"), s.apiTLS(), s.ns, s.c.Kubeconfig(), runner, kubeReapers)
}

// runnerBlock is the kube runner's block, a cycle every tick.
func runnerBlock(tick time.Duration) string {
	return fmt.Sprintf(`runner {
  interval = %q
  kube {
    image = "reaper-kubee2e"
  }
}`, tick)
}

// daemon is one reaperd process, its log in a file.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startDaemon starts a reaperd replica on the scenario's configuration.
func (s *scenario) startDaemon() *daemon {
	s.t.Helper()
	return s.startDaemonWith(s.config())
}

// startDaemonWith starts a replica on the configuration file config.
func (s *scenario) startDaemonWith(config string) *daemon {
	s.t.Helper()
	d := &daemon{name: fmt.Sprintf("reaperd#%d", len(s.daemons)+1), done: make(chan struct{})}
	d.log = filepath.Join(s.dir, d.name+".log")
	logf, err := os.Create(d.log)
	if err != nil {
		s.t.Fatal(err)
	}
	d.cmd = exec.Command(filepath.Join(binDir, "reaperd"), "run", "-config", config)
	d.cmd.Env = append(os.Environ(), "REAPER_DSN=", markEnv+"="+s.mark)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { _ = d.cmd.Wait(); _ = logf.Close(); close(d.done) }()
	s.daemons = append(s.daemons, d)
	s.t.Cleanup(d.kill)
	return d
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process (its plugins die with it).
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// stop sends SIGTERM and waits up to bound for a clean exit.
func (d *daemon) stop(bound time.Duration) bool {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return true
	case <-time.After(bound):
		d.kill()
		return false
	}
}

// holds reports whether holder is the name the replica holds the board's
// lease under (host/pid/random: its prefix names the process).
func (d *daemon) holds(holder string) bool {
	host, _ := os.Hostname()
	return strings.HasPrefix(holder, fmt.Sprintf("%s/%d/", host, d.pid()))
}

func (d *daemon) tail(n int) string {
	b, _ := os.ReadFile(d.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// leader waits until one of the live replicas holds the lease and returns
// it, remembering when its term was gained.
func (s *scenario) leader(bound time.Duration) *daemon {
	s.t.Helper()
	var found *daemon
	s.eventually(bound, "a replica to lead", func() bool {
		l, ok := s.leaderNow()
		if !ok || !l.Held(time.Now()) {
			return false
		}
		for _, d := range s.daemons {
			if !d.exited() && d.holds(l.Holder) {
				found = d
			}
		}
		return found != nil
	})
	return found
}

func (s *scenario) leaderNow() (board.Lease, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	l, ok, err := s.store.CurrentLeader(ctx)
	if err != nil || !ok {
		return board.Lease{}, false
	}
	s.terms[l.Term] = l.AcquiredAt
	return l, true
}

// eventually polls cond every 100ms until it holds, failing the scenario
// when bound passes first.
func (s *scenario) eventually(bound time.Duration, what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s", bound, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// command is a task's shell command. Each execution holds an exclusive
// flock on its task's lock file for its whole life (the lock goes when
// the last process of the execution does): an execution that finds it
// taken runs at the same time as another, and says so in the task's log.
// It then logs a start line, its body, an end line (history_test.go reads
// them: the shell's pid leads the execution's process group).
func (s *scenario) command(ts taskSpec) string {
	if s.ledger != nil {
		return s.ledger.command(ts)
	}
	q := func(p string) string { return "'" + p + "'" }
	log := q(filepath.Join(s.taskDir, ts.id+".log"))
	lock := q(filepath.Join(s.taskDir, ts.id+".lock"))
	release := s.release
	if ts.gate != "" {
		release = filepath.Join(s.taskDir, ts.gate)
	}
	wait := "until [ -e " + q(release) + " ]; do sleep 0.2; done"
	body := wait
	if ts.victim {
		body = `if [ "$REAPER_TRY" = 1 ] && [ ! -e ` + q(filepath.Join(s.taskDir, ts.id+".started")) + ` ]; then touch ` +
			q(filepath.Join(s.taskDir, ts.id+".started")) + "; " + wait + "; else sleep 1; fi"
	}
	return "exec 9>>" + lock + "; flock -n 9 || echo \"double $REAPER_TRY $REAPER_EPOCH\" >> " + log +
		`; echo "start $REAPER_TRY $REAPER_EPOCH $$ $(date +%s.%N)" >> ` + log + "; " + body +
		`; echo "end $REAPER_TRY $REAPER_EPOCH $$ $(date +%s.%N)" >> ` + log
}

// execLog is what a task's log says: its executions started and ended,
// and the executions that found another running.
type execLog struct{ starts, ends, doubles int }

func (s *scenario) execLog(task string) execLog {
	var l execLog
	f, err := os.Open(filepath.Join(s.taskDir, task+".log"))
	if err != nil {
		return l
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch strings.Fields(sc.Text() + " x")[0] {
		case "start":
			l.starts++
		case "end":
			l.ends++
		case "double":
			l.doubles++
		}
	}
	return l
}

// reaperctl runs one reaperctl command in process on the scenario's board.
func (s *scenario) reaperctl(args ...string) (string, error) {
	var out strings.Builder
	full := append([]string{args[0], "-config", s.config()}, args[1:]...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code := (ctl.CLI{Getenv: func(string) string { return "" }}).Run(ctx, full, &out, &out); code != 0 {
		return out.String(), fmt.Errorf("reaperctl %s: exit %d: %s", args[0], code, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// submit submits the scenario's run of kube tasks, as a scheduler would
// (reaperctl submits Lite tasks only).
func (s *scenario) submit(tasks ...taskSpec) {
	s.t.Helper()
	s.tasks = tasks
	run := lifecycle.NewRun{RunID: runID, DagID: "kubee2e", State: sdk.RunRunning}
	for _, ts := range tasks {
		executor := sdk.ExecutorKube
		if s.executor != "" {
			executor = s.executor
		}
		run.Tasks = append(run.Tasks, lifecycle.NewTask{TaskID: ts.id, Executor: executor,
			Retries: int32(s.retries), InfraBudget: s.infraBudget, Command: s.command(ts), Upstreams: ts.upstreams})
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := lifecycle.New(s.pool, lifecycle.Options{}).CreateRun(ctx, run, time.Now()); err != nil {
		s.t.Fatalf("submit the run: %v", err)
	}
}

// row reads a task's row.
func (s *scenario) taskRow(task string) (board.TaskInstance, error) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	return s.store.TaskInstance(ctx, runID, task)
}

// waitRunning waits until task's first attempt runs, has started its
// command and heartbeated, and returns the attempt and its pod (none for
// a warm attempt).
func (s *scenario) waitRunning(task string) (sdk.Attempt, *corev1.Pod) {
	s.t.Helper()
	var ti board.TaskInstance
	s.eventually(60*time.Second, task+" to run and heartbeat", func() bool {
		var err error
		ti, err = s.taskRow(task)
		return err == nil && ti.State == sdk.StateRunning && !ti.LastHeartbeatAt.IsZero() && s.execLog(task).starts > 0
	})
	if s.executor == sdk.ExecutorWarm {
		return ti.Attempt, nil // it runs in a worker's pod, not one of its own
	}
	p, err := s.podOf(ti.Attempt)
	if err != nil {
		s.t.Fatalf("the pod of %s: %v", ti.Attempt, err)
	}
	return ti.Attempt, p
}

// podOf finds the live pod of attempt a.
func (s *scenario) podOf(a sdk.Attempt) (*corev1.Pod, error) {
	l, _ := kube.AttemptLabels(a)
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(l).String()})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if p := &list.Items[i]; p.DeletionTimestamp == nil && p.Annotations[kube.AnnotationRawTaskID] == a.TaskID {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no live pod of %s", a)
}

// podGone waits until the pod named name is gone from the API server.
func (s *scenario) podGone(name string, bound time.Duration) time.Time {
	s.t.Helper()
	s.eventually(bound, "pod "+name+" to go", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		_, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	return time.Now()
}

// deletePod deletes a pod at once (grace 0, as a lost node's pods go).
func (s *scenario) deletePod(p *corev1.Pod) {
	s.t.Helper()
	zero := int64(0)
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := s.cs.CoreV1().Pods(s.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil && !apierrors.IsNotFound(err) {
		s.t.Fatalf("delete pod %s: %v", p.Name, err)
	}
}

// sweep kills whatever carries the scenario's marker.
func (s *scenario) sweep() {
	for _, d := range s.daemons {
		if !d.exited() {
			d.kill()
		}
	}
	marked.KillAll(markEnv, s.mark)
}

// dump logs what a failed scenario needs to be understood.
func (s *scenario) dump() {
	for _, d := range s.daemons {
		s.t.Logf("%s (pid %d) log tail:\n%s", d.name, d.pid(), d.tail(60))
	}
	if out, err := s.reaperctl("status", "-v", runID); err == nil {
		s.t.Logf("reaperctl status -v:\n%s", out)
	}
	for _, ts := range s.tasks {
		if out, err := s.reaperctl("explain", runID, ts.id); err == nil {
			s.t.Logf("reaperctl explain %s:\n%s", ts.id, out)
		}
		b, _ := os.ReadFile(filepath.Join(s.taskDir, ts.id+".log"))
		s.t.Logf("task %s log:\n%s", ts.id, b)
	}
	if s.real != nil {
		s.dumpRealPods()
		return
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, "player.log"))
	lines := strings.Split(string(b), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	s.t.Logf("player log tail:\n%s", strings.Join(lines, "\n"))
}

// evict evicts a pod through the Eviction API, as a drain does: the
// disruption controller's DisruptionTarget, then its deletion.
func (s *scenario) evict(p *corev1.Pod) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := s.cs.PolicyV1().Evictions(s.ns).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: s.ns},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
	}); err != nil {
		s.t.Fatalf("evict pod %s: %v", p.Name, err)
	}
}

// preempt plays the scheduler preempting a pod: its DisruptionTarget
// condition with reason PreemptionByScheduler through the status
// subresource, then a graceful delete.
func (s *scenario) preempt(p *corev1.Pod) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
			Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler", LastTransitionTime: metav1.Now(),
			Message: "kubee2e: preempted by a pod of higher priority"})
		_, err = s.cs.CoreV1().Pods(s.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		s.t.Fatalf("mark pod %s preempted: %v", p.Name, err)
	}
	if err := s.cs.CoreV1().Pods(s.ns).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil {
		s.t.Fatalf("delete the preempted pod %s: %v", p.Name, err)
	}
}

// oomKill asks the player to OOM-kill a pod's task container.
func (s *scenario) oomKill(p *corev1.Pod) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	patch := []byte(`{"metadata":{"annotations":{"` + kubelet.AnnotationOOMKill + `":"true"}}}`)
	if _, err := s.cs.CoreV1().Pods(s.ns).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		s.t.Fatalf("annotate pod %s for the OOM kill: %v", p.Name, err)
	}
}

// agentOf finds the agent process of task's attempt a.
func (s *scenario) agentOf(a sdk.Attempt) int {
	s.t.Helper()
	for _, p := range marked.Processes(markEnv, s.mark) {
		cmdline := p.Cmdline + " "
		if strings.Contains(cmdline, "reaper-agent") && strings.Contains(cmdline, "-task="+a.TaskID+" ") &&
			strings.Contains(cmdline, fmt.Sprintf("-epoch=%d ", a.Epoch)) {
			return p.PID
		}
	}
	s.t.Fatalf("no agent process of %s", a)
	return 0
}
