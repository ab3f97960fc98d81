package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The kube edition on the test cluster's real node (REAPER_SOAK_NODE=real):
// the same PostgreSQL, replicas, stream and invariants, the pods run by a
// real kubelet, containerd and runc (kubetest.Options.RealNode) from a task
// image the soak imports (the agent built static, a static busybox for the
// tasks' shell), the agents reporting to the attempt API over the pod
// network with the node's operator certificate.
//
// The accounts the invariants read, and how each reaches the soak from a
// container:
//   - the agents' journals: the runner's pods carry no volume of the soak's
//     (the soak changes nothing of the product's pod), so the image's agent
//     is a wrapper that sets the journal directory to the pod's own scratch
//     volume (kuberunner.TmpDir) and the soak's marker before it runs the
//     agent. The kubelet keeps that volume under its pods directory on the
//     host; the soak hard-links each journal, as soon as it appears, into a
//     directory of its own beside the pods (inside the kubelet's root
//     directory, a mount point a link cannot cross; where a link fails it
//     copies what the journal gains instead), so the journal outlives its
//     pod's volume, and copies them into its journal directory when it
//     stops. An attempt its agent reported running and whose journal
//     never reached the soak fails the soak at the end (checkJournals): the
//     invariants could not have judged it.
//   - the process table: the containers' processes are the host's; the
//     journals name them by their pod's process namespace (the pods share
//     one), so each agent's and each task group leader's pid is resolved to
//     the host's (pidResolver: the same start time, the same pid innermost
//     in its NSpid, in the pod's cgroup). The rest of the observer is the
//     player's: a group is alive while a host process has its leader's
//     host pid as its group.
//   - the pods' stops (the API server's watch), the database's triggers and
//     the audit: as on the player.
//
// The faults: those of the player's edition but the node deletion (one real
// node), plus the kubelet killed -9 and restarted after a moment (its
// containers run on under containerd), the kubelet frozen (SIGSTOP) for
// less than the controller manager's node monitor grace (the node stays
// Ready; its pods' stops wait for it), and the wedged agent (SIGSTOP of the
// agent inside its container, resumed after a while; the heartbeat reaper
// may mark it after agent_lost of silence and stop its pod in place). An
// agent killed -9 takes its task group with it: its container's main
// process is gone, so the runtime kills the container's other processes.

// Node switch of the kube edition.
const (
	nodeEnv  = "REAPER_SOAK_NODE" // "kwok" (default: KWOK nodes, the kubelet player) or "real"
	nodeKWOK = "kwok"
	nodeReal = "real"
)

// The real node's faults.
const (
	FaultKubeletKill  = "kill_kubelet"
	FaultKubeletPause = "pause_kubelet"
	// FaultTeardownRefused freezes a running attempt's agent and has the
	// API server refuse every update and delete of its pod for longer than
	// agent_lost and the infra confirmation valve together, then lifts the
	// refusal and resumes the agent.
	FaultTeardownRefused = "refuse_teardown_past_valve"
)

// realFaultWeights: the real node's draw (no node deletion: one node), the
// player edition's nemeses and the teardown refused past the valve.
var realFaultWeights = []faultWeight{
	{FaultAgentKill, 3}, {FaultAgentPause, 2}, {FaultPodDelete, 4}, {FaultEviction, 3},
	{FaultKubeletKill, 2}, {FaultKubeletPause, 1}, {FaultAPIPause, 1},
	{FaultLeaderKill, 2}, {FaultLeaderPause, 2}, {FaultPostgres, 1}, {FaultBurst, 1},
	{FaultPartition, 2}, {FaultFreeze, 1}, {FaultFailover, 1}, {FaultAPIPartition, 2}, {FaultTeardownRefused, 2},
}

// The real node's task image and agent.
const (
	realTaskImage = "reaper.local/soak-task:v1"
	// realAgent is the wrapper the runner runs as the agent: the journal
	// in the pod's scratch volume, the soak's marker, then the agent.
	realAgent = "/usr/local/bin/reaper-agent-soak"
	// realMaxParallel bounds the attempts queued plus running (the
	// runner's max_parallel): each running pod costs the node about
	// 14 MiB and a share of two cores.
	realMaxParallel = 20
	// realStreamGap is the real node's least wait between two runs of the
	// stream (a run every 3 to 6 seconds, half the player's rate): a real
	// pod's start and end cost more than a played one's, and the runner
	// dispatches nothing while a new leader's settling gate runs, so at
	// the player's rate the queue outgrew the node and never drained
	// within the recovery bound.
	realStreamGap = 3 * time.Second
)

// realJournalDir is where a pod's agent journals: in its scratch volume.
var realJournalDir = filepath.Join(kuberunner.TmpDir, "soak-journal")

// startKubeReal starts the cluster with its real node, imports the task
// image, and starts the scheduler, the journal linker and the pod watch.
func (s *soak) startKubeReal(ctx context.Context) {
	t := s.t
	c, err := kubetest.Start(ctx, kubetest.Options{BaseDir: s.dir, RealNode: true})
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeWorld{s: s, c: c, cs: c.Client(t), seen: map[string]bool{}, ns: "soak", apiCut: map[int]bool{}}
	s.kube = k
	n, why := c.RealNode()
	if n == nil {
		t.Fatalf("%s=%s: the test cluster has no real node: %s", nodeEnv, nodeReal, why)
	}
	k.real = n
	if k.apiListen, err = freeAddrOn(kubetest.NodeGateway); err != nil {
		t.Fatal(err)
	}
	if err := s.importTaskImage(ctx, n); err != nil {
		t.Fatal(err)
	}
	podsDir, err := kubeletPodsDir(c.KubeletPID())
	if err != nil {
		t.Fatal(err)
	}
	wctx, err := k.makeNamespace(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if k.binder, err = kubetest.StartBinder(wctx, kubetest.BinderConfig{Client: k.cs, Namespace: k.ns,
		Nodes: []string{n.Name}, Timeout: apiTimeout}); err != nil {
		t.Fatal(err)
	}
	k.pids = &pidResolver{agents: map[string]int{}}
	// A hard link cannot cross a mount point, and the kubelet's root
	// directory is one (it binds it onto itself): the links live in it,
	// beside the pods, and are copied into the soak's journal directory
	// when the soak stops.
	links := filepath.Join(filepath.Dir(podsDir), "soak-journals-"+s.mark)
	if err := os.Mkdir(links, 0o700); err != nil {
		t.Fatal(err)
	}
	k.journals = &journalLinker{podsDir: podsDir, dst: links, seen: map[string]*linked{}}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		every(wctx, 50*time.Millisecond, k.journals.scan)
		k.journals.scan() // what the last moments added
	}()
	if err := k.watch(wctx); err != nil {
		t.Fatal(err)
	}
}

// importTaskImage builds the agent static (the image has no libc) and
// imports the task image with the soak's agent wrapper.
func (s *soak) importTaskImage(ctx context.Context, n *kubetest.RealNode) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	bin := filepath.Join(s.dir, "reaper-agent-static")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/dexaflow/reaper/cmd/reaper-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the static agent: %w: %s", err, out)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nmkdir -p %s || exit 125\nexport %s=%s %s=%s\nexec %s \"$@\"\n",
		realJournalDir, agent.JournalDirEnv, realJournalDir, markEnv, s.mark, kubetest.TaskAgent)
	if err := n.ImportTaskImage(ctx, realTaskImage, bin, kubetest.Script{Path: realAgent, Text: wrapper}); err != nil {
		return fmt.Errorf("import the soak's task image: %w", err)
	}
	return nil
}

// kubeletPodsDir is the pods directory of the kubelet with pid (its
// --root-dir, read from its command line): each pod's volumes are there.
func kubeletPodsDir(pid int) (string, error) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", fmt.Errorf("read the kubelet's command line: %w", err)
	}
	if dir := podsDirOf(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")); dir != "" {
		return dir, nil
	}
	return "", errors.New("the kubelet's command line names no --root-dir")
}

// podsDirOf is the pods directory under the --root-dir of a kubelet's
// arguments, "" when they name none.
func podsDirOf(args []string) string {
	for i, a := range args {
		switch {
		case a == "--root-dir" && i+1 < len(args):
			return filepath.Join(args[i+1], "pods")
		case strings.HasPrefix(a, "--root-dir="):
			return filepath.Join(strings.TrimPrefix(a, "--root-dir="), "pods")
		}
	}
	return ""
}

// freeAddrOn returns a free port on ip as host:port.
func freeAddrOn(ip string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", ip, err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// realKubeConfigHCL is every replica's configuration on the real node: the
// attempt API on the pod network's gateway with the node's operator
// certificate, and the runner's pods from the soak's task image, never
// pulled, their agent the soak's wrapper, at most realMaxParallel at once.
func realKubeConfigHCL(bin, dsn, kubeconfig, ns string, k *kubeWorld, apiState string) string {
	tls := fmt.Sprintf("  tls_cert  = %q\n  tls_key   = %q\n  tls_ca    = %q\n", k.real.APICert, k.real.APIKey, k.real.CA)
	runner := fmt.Sprintf(`runner {
  interval     = %q
  max_parallel = %d
  kube {
    image             = %q
    image_pull_policy = "Never"
    agent             = %q
    attempt_api       = "https://%s"
  }
}`, runnerTick, realMaxParallel, realTaskImage, realAgent, k.apiListen)
	return kubeHCL(bin, dsn, kubeconfig, ns, k.apiListen, apiState, tls, runner)
}

// injectKubelet throws one of the real node's kubelet faults. One at a
// time: a frozen kubelet cannot be killed and restarted meanwhile.
func (in *injector) injectKubelet(ctx context.Context, kind string, d1, dPause time.Duration) (*Fault, error) {
	s, k := in.s, in.s.kube
	if k.real == nil {
		return nil, errNoTarget
	}
	if !k.kubeletMu.TryLock() {
		return nil, errNoTarget
	}
	defer k.kubeletMu.Unlock()
	pid := k.c.KubeletPID()
	switch kind {
	case FaultKubeletKill:
		if err := k.c.KillKubelet(); err != nil {
			return nil, err
		}
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("kubelet (pid %d) killed -9, started again after %s", pid, d1.Round(time.Millisecond))})
		sleep(context.WithoutCancel(ctx), d1)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := k.c.StartKubelet(sctx)
		cancel()
		if err != nil {
			s.fail(Violation{Check: "harness", Evidence: "start the kubelet again: " + err.Error()})
		}
		in.ended(f)
		return f, nil
	case FaultKubeletPause:
		if err := k.c.PauseKubelet(); err != nil {
			return nil, err
		}
		f := in.record(Fault{Kind: kind, At: s.tl.now(),
			Detail: fmt.Sprintf("kubelet (pid %d) stopped (SIGSTOP) for %s, under the node monitor grace %s",
				pid, dPause.Round(time.Millisecond), kubetest.NodeMonitorGrace)})
		sleep(context.WithoutCancel(ctx), dPause)
		if err := k.c.ResumeKubelet(); err != nil {
			s.fail(Violation{Check: "harness", Evidence: "resume the kubelet: " + err.Error()})
		}
		in.ended(f)
		return f, nil
	}
	return nil, fmt.Errorf("unknown kubelet fault %q", kind)
}

// injectTeardownRefused throws FaultTeardownRefused at a drawn running
// attempt, one at a time: a validating webhook that cannot be called
// (failurePolicy Fail) on the updates and deletions of that attempt's pod
// alone, so that every stop in place and every delete of it is refused
// (its status, which the kubelet writes, is another resource and goes
// through), and its agent SIGSTOPped, so that it neither heartbeats nor
// hears should_terminate. agent_lost marks the attempt, its teardown is
// refused and owed, and the valve passes while the refusal lasts: the
// runner must hold the mark rather than re-place the attempt beside a
// container that may still run. The refusal is lifted, and the agent
// resumed a drawn moment later (if its pod's end has not taken it).
func (in *injector) injectTeardownRefused(ctx context.Context, st step) (*Fault, error) {
	s, k := in.s, in.s.kube
	if k.real == nil || !k.teardownMu.TryLock() {
		return nil, errNoTarget
	}
	defer k.teardownMu.Unlock()
	e, ok := in.target(st.pick)
	if !ok {
		return nil, errNoTarget
	}
	in.mu.Lock()
	busy := in.paused[e.AgentPID]
	in.paused[e.AgentPID] = true // no other fault picks it meanwhile
	in.mu.Unlock()
	if busy {
		return nil, errNoTarget
	}
	defer func() {
		in.mu.Lock()
		delete(in.paused, e.AgentPID)
		in.mu.Unlock()
	}()
	l, ok := s.obs.agentOf(e.AgentPID)
	if !ok {
		return nil, errNoTarget
	}
	p, err := k.podOf(ctx, e.Attempt)
	if err != nil {
		return nil, err
	}
	lift, err := k.refusePodWrites(ctx, p)
	if err != nil {
		return nil, err
	}
	defer lift()
	if _, err := proc.Signal(e.AgentPID, syscall.SIGSTOP); err != nil {
		return nil, err
	}
	a := e.Attempt
	past := infraConfirmValve + interval + st.dPause
	f := in.record(Fault{Kind: FaultTeardownRefused, At: s.tl.now(), Target: &a,
		Detail: fmt.Sprintf("agent %d of %s stopped, the updates and deletions of pod %s refused until %s past its mark, the agent resumed %s after",
			e.AgentPID, a, p.Name, past.Round(time.Millisecond), st.d1.Round(time.Millisecond))})
	// Until the attempt is marked (agent_lost of silence, later when a
	// leadership change's settling grace falls in between), then past the
	// valve counted from the mark: the valve passes while the teardown is
	// refused.
	markBound := s.tl.now().Add(agentLost + lease + grace + 2*interval + 30*time.Second)
	marked := false
	for !marked && ctx.Err() == nil && s.tl.now().Before(markBound) {
		sleep(ctx, 250*time.Millisecond)
		marked = k.movedOn(ctx, a)
	}
	if marked {
		sleep(ctx, past)
	}
	lifted := s.tl.now()
	lift()
	sleep(context.WithoutCancel(ctx), st.d1)
	if info, err := proc.Stat(l.PID); err == nil && info.Start == l.StartTicks {
		_, _ = proc.Signal(l.PID, syscall.SIGCONT)
	}
	in.ended(f)
	held, opened := k.valveDecisions(a, lifted)
	s.logf("fault %-22s %s: marked %t, refusal lifted after %s; the runner held the mark past the valve %d times, opened the valve %d times before the lift",
		FaultTeardownRefused, a, marked, lifted.Sub(f.At).Round(time.Millisecond), held, opened)
	return f, nil
}

// movedOn reports whether the board has moved attempt a on from queued
// or running (a mark, an end, a later try or epoch).
func (k *kubeWorld) movedOn(ctx context.Context, a sdk.Attempt) bool {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	var try, epoch int32
	var state string
	if err := k.s.pool.QueryRow(ctx, `SELECT try_number, attempt_epoch, state FROM task_instances
	    WHERE run_id = $1 AND task_id = $2`, a.RunID, a.TaskID).Scan(&try, &epoch, &state); err != nil {
		return false // the database is down or cut: ask again
	}
	return try != a.Try || epoch != a.Epoch || (state != sdk.StateQueued && state != sdk.StateRunning)
}

// refusePodWrites installs a validating webhook that cannot be called on
// the updates and deletions of pod p (selected by its attempt's labels),
// waits until the API server refuses them (a dry-run update), and returns
// its removal, which is idempotent and fails the soak if the webhook
// cannot be removed (every teardown of the pod would stay refused).
func (k *kubeWorld) refusePodWrites(ctx context.Context, p *corev1.Pod) (func(), error) {
	fail := admissionv1.Fail
	none := admissionv1.SideEffectClassNone
	url := "https://127.0.0.1:1/validate"
	sel := map[string]string{}
	for _, l := range []string{kube.LabelRunID, kube.LabelTaskID, kube.LabelTryNumber, kube.LabelAttemptEpoch} {
		v, ok := p.Labels[l]
		if !ok {
			return nil, fmt.Errorf("pod %s has no label %s", p.Name, l)
		}
		sel[l] = v
	}
	hook := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "soak-refuse-" + p.Name},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:         "refuse.soak.reaper.test",
			ClientConfig: admissionv1.WebhookClientConfig{URL: &url},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: []admissionv1.OperationType{admissionv1.Update, admissionv1.Delete},
				Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": k.ns}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: sel},
		}},
	}
	hooks := k.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	_, err := hooks.Create(cctx, hook, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("install the webhook refusing pod %s's writes: %w", p.Name, err)
	}
	removed := false
	remove := func() {
		if removed {
			return
		}
		removed = true
		var err error
		for range 5 {
			rctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
			err = hooks.Delete(rctx, hook.Name, metav1.DeleteOptions{})
			cancel()
			if err == nil || apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(time.Second)
		}
		k.s.fail(Violation{Check: "harness", Evidence: "remove the webhook refusing pod " + p.Name + "'s writes: " + err.Error()})
	}
	// The API server loads a new webhook a moment after it is created.
	patch := []byte(`{"metadata":{"annotations":{"soak.reaper.test/probe":"x"}}}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, apiTimeout)
		_, err := k.cs.CoreV1().Pods(k.ns).Patch(pctx, p.Name, types.MergePatchType, patch,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		cancel()
		switch {
		case err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil:
			return remove, nil // refused by the webhook
		case err != nil && apierrors.IsNotFound(err), ctx.Err() != nil, time.Now().After(deadline):
			remove()
			return nil, errNoTarget
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// valveDecisions counts the runner's decisions on a at the valve: the
// holds (infra_confirm_valve_held) and the opens (infra_confirm_valve_open)
// before lifted, while the teardown was refused.
func (k *kubeWorld) valveDecisions(a sdk.Attempt, lifted time.Time) (held, opened int) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := k.s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE label = $1),
	        count(*) FILTER (WHERE label = $2 AND at < $7)
	    FROM reap_decisions WHERE run_id = $3 AND task_id = $4 AND try_number = $5 AND attempt_epoch = $6`,
		sdk.LabelInfraConfirmValveHeld, sdk.LabelInfraConfirmValveOpen, a.RunID, a.TaskID, a.Try, a.Epoch,
		lifted).Scan(&held, &opened); err != nil {
		return -1, -1
	}
	return held, opened
}

// saveJournals copies the journals brought out into the soak's journal
// directory (the cluster's stop removes the kubelet's directory, links
// and all): the evidence of a failed soak.
func (k *kubeWorld) saveJournals() {
	files, _ := filepath.Glob(filepath.Join(k.journals.dst, "*.journal"))
	for _, f := range files {
		appendFrom(f, filepath.Join(k.s.journalDir, filepath.Base(f)), 0)
	}
}

// checkJournals fails the soak for every attempt that its agent reported
// running (the database's own record of the report) and of whose agent no
// journal reached the soak: its executions were never judged. (Not every
// attempt with a heartbeat row: a retry's reset of the heartbeat is one,
// and a pod whose container never started has no agent.)
func (k *kubeWorld) checkJournals(ctx context.Context) {
	s := k.s
	h, err := s.history(context.WithoutCancel(ctx))
	if err != nil {
		s.fail(Violation{Check: "harness", Evidence: "read the history for the journals' check: " + err.Error()})
		return
	}
	journaled := map[sdk.Attempt]bool{}
	for _, a := range h.Agents {
		journaled[a.Attempt] = true
	}
	var missing []string
	reported := map[sdk.Attempt]bool{}
	for _, tr := range h.Transitions {
		if tr.NewState == sdk.StateRunning && tr.OldState != sdk.StateRunning && !reported[tr.From] {
			reported[tr.From] = true
			if !journaled[tr.From] {
				missing = append(missing, tr.From.String())
			}
		}
	}
	sort.Strings(missing)
	for _, a := range missing {
		s.fail(Violation{Check: "harness", Evidence: fmt.Sprintf(
			"%s was reported running, but no journal of its agent reached the soak from its pod's volume: its executions went unjudged", a)})
	}
}

// realReport adds the real node's rows to the report.
func (k *kubeWorld) realReport(row func(string, any)) {
	links, copies := k.journals.counts()
	row("node", fmt.Sprintf("real (%s: kubelet, containerd, runc), max_parallel %d", k.real.Name, realMaxParallel))
	row("journals out of the pods' volumes", fmt.Sprintf("%d linked, %d copied", links, copies))
	p := k.pids.counts()
	row("pids resolved to the host's", fmt.Sprintf("agents %d (%d not found), task groups %d (%d not found)",
		p.agents, p.agentsMissed, p.groups, p.groupsMissed))
}

// journalLinker brings the agents' journals out of their pods' scratch
// volumes into dst, named <pod uid>.<journal>.
type journalLinker struct {
	podsDir, dst string

	mu   sync.Mutex
	seen map[string]*linked // by source path
}

// linked is one journal brought out: hard-linked (it then grows in place),
// or copied so far (off bytes).
type linked struct {
	dst    string
	copied bool
	off    int64
}

// scan links the journals not yet linked, and copies what copied ones
// gained.
func (j *journalLinker) scan() {
	srcs, _ := filepath.Glob(filepath.Join(j.podsDir, "*", "volumes", "kubernetes.io~empty-dir", kuberunner.TmpVolume,
		filepath.Base(realJournalDir), "*.journal"))
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, src := range srcs {
		l := j.seen[src]
		if l == nil {
			// <pods>/<uid>/volumes/...: the pod's uid names the copy.
			uid := strings.SplitN(strings.TrimPrefix(src, j.podsDir+string(filepath.Separator)), string(filepath.Separator), 2)[0]
			l = &linked{dst: filepath.Join(j.dst, uid+"."+filepath.Base(src))}
			if err := os.Link(src, l.dst); err != nil {
				l.copied = true
			}
			j.seen[src] = l
		}
		if l.copied {
			l.off = appendFrom(src, l.dst, l.off)
		}
	}
}

// appendFrom appends what src holds past off to dst and returns the new
// offset (off unchanged when src cannot be read: its pod is gone).
func appendFrom(src, dst string, off int64) int64 {
	f, err := os.Open(src)
	if err != nil {
		return off
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return off
	}
	data, err := io.ReadAll(f)
	if err != nil || len(data) == 0 {
		return off
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return off
	}
	defer out.Close()
	n, _ := out.Write(data)
	return off + int64(n)
}

// counts reports how many journals were linked and how many copied.
func (j *journalLinker) counts() (links, copies int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, l := range j.seen {
		if l.copied {
			copies++
		} else {
			links++
		}
	}
	return links, copies
}

// pidResolver rewrites the pids a real node's agent journals (its pod's
// process namespace's) to the host's. A process it cannot find (it had
// already exited when its line was read) gets a stand-in below zero, which
// no process has: the observer then finds it gone at its first look.
type pidResolver struct {
	mu     sync.Mutex
	agents map[string]int // journal file -> its agent's host pid (or stand-in)
	next   int            // the last stand-in given
	n      resolved
}

// resolved counts the resolutions.
type resolved struct{ agents, agentsMissed, groups, groupsMissed int }

func (r *pidResolver) counts() resolved {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// resolve rewrites the entries read from the journal at path (named
// <pod uid>.<journal> by the linker): the agent's pid on every line, the
// task group's on task_start.
func (r *pidResolver) resolve(path string, es []agent.JournalEntry) {
	uid, _, _ := strings.Cut(filepath.Base(path), ".")
	r.mu.Lock()
	defer r.mu.Unlock()
	var host *hostProcs // read once per call, when needed
	find := func(nsPID int, start uint64) (int, bool) {
		if host == nil {
			host = readHostProcs()
		}
		return host.find(uid, nsPID, start)
	}
	// lookup is find, or a stand-in when the process is not found,
	// counted in found or missed.
	lookup := func(nsPID int, start uint64, found, missed *int) int {
		if pid, ok := find(nsPID, start); ok {
			*found++
			return pid
		}
		*missed++
		return r.standIn()
	}
	for i := range es {
		e := &es[i]
		if e.Event == agent.JournalAgentStart {
			r.agents[path] = lookup(e.PID, e.AgentStart, &r.n.agents, &r.n.agentsMissed)
		}
		pid, ok := r.agents[path]
		if !ok { // no agent_start read: the agent cannot be told apart
			pid = r.standIn()
			r.agents[path] = pid
		}
		e.PID = pid
		if e.Event == agent.JournalTaskStart {
			e.PGID = lookup(e.PGID, e.LeaderStart, &r.n.groups, &r.n.groupsMissed)
		}
	}
}

func (r *pidResolver) standIn() int {
	r.next--
	return r.next
}

// hostProcs is one look at the host's processes, by start time.
type hostProcs struct{ byStart map[uint64][]int }

func readHostProcs() *hostProcs {
	h := &hostProcs{byStart: map[uint64][]int{}}
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if info, err := proc.Stat(pid); err == nil && !info.Zombie {
			h.byStart[info.Start] = append(h.byStart[info.Start], pid)
		}
	}
	return h
}

// find returns the host pid of the process that started at start, is
// nsPID in its innermost pid namespace, and is in the cgroup of the pod
// with uid.
func (h *hostProcs) find(uid string, nsPID int, start uint64) (int, bool) {
	if nsPID <= 0 || start == 0 {
		return 0, false
	}
	for _, pid := range h.byStart[start] {
		if innermostPID(pid) != nsPID {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err == nil && bytes.Contains(cg, []byte("/pod"+uid+"/")) {
			return pid, true
		}
	}
	return 0, false
}

// innermostPID is pid's pid in its innermost pid namespace (the last of
// its status's NSpid), 0 when unknown.
func innermostPID(pid int) int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	return 0
}
