// Package kubelet is a test harness that plays the kubelet's container
// side for pods KWOK runs, so that the kube edition's tests, demo and fault
// suite run real agents in "pods" on a real API server without a container
// runtime.
//
// # Who does what
//
// KWOK keeps the node and moves every pod through its stages: it makes a
// bound pod Running (phase, startTime, conditions, a running container
// state) and finishes a deleted pod at once. It runs nothing. The Player
// owns what happens inside the containers of the pods it is given, those
// labelled LabelOwner=OwnerValue (Own adds the label):
//
//   - once KWOK reports such a pod Running, the player starts its task
//     container (TaskContainer, else the first: a warm pool worker's one
//     container, "worker", runs the agent in worker mode) as a local
//     process: the
//     container's command and args (no image is pulled, so the command must
//     be given; its first word is looked up in Config.Commands, then on
//     PATH), with the container's env (literal values and the downward-API
//     fields listed at fieldValue), in a session of its own, with a
//     scratch directory as its TMPDIR and working directory. It then writes
//     the container running with the process's startedAt.
//   - the container's termination message is a file in that directory; the
//     process is told its path in REAPER_RECORD_FILE, which replaces any
//     value the pod spec gives it (a real kubelet mounts the file at the
//     container's terminationMessagePath).
//   - a projected serviceAccountToken volume the container mounts is
//     filled as a kubelet fills it: a TokenRequest for the pod's
//     ServiceAccount bound to the pod, with the source's audience and
//     expiry, written into the container's directory; the process is told
//     the file in REAPER_POD_TOKEN_FILE (see projectTokens).
//   - when the process exits, the player writes what the kubelet would: the
//     container terminated with its exit code (128+signal when a signal
//     ended it), reason Completed, Error or OOMKilled, the termination
//     message read from the file (at most 4096 bytes), startedAt and
//     finishedAt; the pod Succeeded on exit 0, else Failed. Every other
//     process left in the session is killed, as a runtime tears a container
//     down with its PID 1.
//   - a pod deleted (or being deleted) gets its process stopped: SIGTERM to
//     the process, then SIGKILL to the whole session after the pod's
//     terminationGracePeriodSeconds (capped by Config.MaxGrace). KWOK
//     removes the pod at once, so nothing is written.
//   - a Running pod past status.startTime + spec.activeDeadlineSeconds
//     (lowering the deadline of a running pod takes effect at once) is
//     stopped the same way and written Failed with reason DeadlineExceeded,
//     its container terminated with what the process left. KWOK's own
//     deadline stage leaves owned pods alone (kwok-stages.yaml selects
//     only pods without LabelOwner), so the two never race.
//   - the annotation AnnotationOOMKill on a running owned pod kills the
//     whole session with SIGKILL and reports the container OOMKilled (exit
//     137), the pod Failed: the kernel's OOM killer as the pod sees it.
//
// Simulated, not real: no image, no cgroup limits (OOMKilled is only
// what the annotation asks for), no restarts (restartPolicy is treated as
// Never), no init or sidecar containers (only the task container runs; the
// others are reported as they are), no probes, no volumes (the only files
// shared with the "container" are its termination message and its
// projected ServiceAccount tokens), and no node
// shutdown, eviction or preemption by the kubelet (tests write those
// statuses themselves). The processes run as the test's user on the test's
// host.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/dexaflow/reaper/sdk/clock"
)

// The names that mark a pod as the player's and steer it.
const (
	// LabelOwner, set to OwnerValue, gives a pod to the player (and takes
	// it from KWOK's deadline stage).
	LabelOwner = "kubetest.reaper/kubelet"
	// OwnerValue is LabelOwner's value.
	OwnerValue = "player"
	// AnnotationOOMKill on a running owned pod OOM-kills its task container.
	AnnotationOOMKill = "kubetest.reaper/oom-kill"
	// TaskContainer is the container the player runs when the pod has one
	// of that name (the kube substrate's task container).
	TaskContainer = "task"
	// MessagePathEnv tells the process where its termination message goes
	// (the agent's record file variable, which the kube runner also sets).
	MessagePathEnv = "REAPER_RECORD_FILE"
	// MaxMessageBytes is the most of a termination message the kubelet
	// keeps.
	MaxMessageBytes = 4096
	// DeadlineMessage is the pod message of a pod past its deadline.
	DeadlineMessage = "Pod was active on the node longer than the specified deadline"
)

// Own labels pod as the player's; call it before the pod is created.
func Own(pod *corev1.Pod) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[LabelOwner] = OwnerValue
}

// Config configures a Player.
type Config struct {
	// Client reaches the API server; it needs get, list, watch on pods,
	// update on pods/status and create on serviceaccounts/token in
	// Namespace. Required.
	Client kubernetes.Interface
	// Namespace is the namespace whose owned pods the player runs. Required.
	Namespace string
	// Selector is the label selector of the pods the player runs; default
	// LabelOwner=OwnerValue (the pods Own marked). A harness whose pods
	// are made by another program (the kube runner) selects them by their
	// own labels; pods without LabelOwner are also matched by KWOK's
	// deadline stage, which then races the player's at activeDeadlineSeconds.
	Selector string
	// Dir is where each container's scratch directory is made. Required.
	Dir string
	// Commands maps the first word of a container's command to a local
	// executable (for example "reaper-agent" to the binary a test built).
	// A word not in it is looked up on PATH.
	Commands map[string]string
	// Env is the base environment of every process, before the
	// container's own (PATH, HOME, ...). Default: PATH and HOME of the
	// player's process.
	Env []string
	// MaxGrace caps a pod's terminationGracePeriodSeconds; default 5s.
	MaxGrace time.Duration
	// Tick is how often deadlines and graces are checked; default 50ms.
	Tick time.Duration
	// Clock times deadlines and graces; default clock.Real.
	Clock clock.Clock
	// Logger is the player's log; default a null logger.
	Logger hclog.Logger
}

// Player plays the kubelet for the owned pods of one namespace.
type Player struct {
	cfg    Config
	log    hclog.Logger
	events chan event
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	conts    map[types.UID]*container // guarded by mu; written by the loop only
	commands map[string]string        // guarded by mu
}

// event is what the loop acts on: a pod seen (or gone), or a process exit.
type event struct {
	pod     *corev1.Pod
	deleted bool
	exited  *container
}

// container is one pod's task container as a local process.
type container struct {
	uid       types.UID
	name      string // the pod's
	container string
	pod       *corev1.Pod // the latest seen
	cmd       *exec.Cmd
	pid       int
	startedAt time.Time
	dir       string
	msgPath   string
	done      chan struct{} // closed when the process has exited and is reaped
	state     *os.ProcessState

	// why the player stopped it: "" (it ended on its own), stopDeleted,
	// stopDeadline or stopOOM.
	stopped string
	killAt  time.Time // when the stop escalates to SIGKILL of the session
	ended   bool      // the final status is written (or not due)
}

const (
	stopDeleted  = "deleted"
	stopDeadline = "DeadlineExceeded"
	stopOOM      = "OOMKilled"
)

// Start starts the player. It runs until ctx ends or Stop is called.
func Start(ctx context.Context, cfg Config) (*Player, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Dir == "" {
		return nil, errors.New("kubelet player: Client, Namespace and Dir are required")
	}
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	}
	if cfg.Selector == "" {
		cfg.Selector = LabelOwner + "=" + OwnerValue
	}
	if cfg.MaxGrace <= 0 {
		cfg.MaxGrace = 5 * time.Second
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Player{cfg: cfg, log: cfg.Logger.Named("kubelet-player"), events: make(chan event, 256), cancel: cancel,
		conts: map[types.UID]*container{}, commands: map[string]string{}}
	for k, v := range cfg.Commands {
		p.commands[k] = v
	}

	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = cfg.Selector }))
	inf := factory.Core().V1().Pods().Informer()
	send := func(ev event) {
		select {
		case p.events <- ev:
		case <-ctx.Done():
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { podEvent(obj, false, send) },
		UpdateFunc: func(_, obj any) { podEvent(obj, false, send) },
		DeleteFunc: func(obj any) { podEvent(obj, true, send) },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("kubelet player: watching pods: %w", err)
	}
	factory.Start(ctx.Done())
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.loop(ctx)
		factory.Shutdown()
	}()
	return p, nil
}

func podEvent(obj any, deleted bool, send func(event)) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		send(event{pod: pod, deleted: deleted})
	}
}

// Stop stops the player: every process it runs is killed (without a
// status write) and every goroutine it started has ended when it returns.
func (p *Player) Stop() {
	p.cancel()
	p.wg.Wait()
}

// MapCommand maps a container command's first word to a local executable
// from now on (Config.Commands, for a command known only once the player
// runs).
func (p *Player) MapCommand(word, path string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.commands[word] = path
}

// Process is a pod's task container process: its pid (the leader of its
// own session) and a channel closed once it has exited. ok is false until
// the player has started it.
func (p *Player) Process(podName string) (pid int, done <-chan struct{}, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conts {
		if c.name == podName {
			return c.pid, c.done, true
		}
	}
	return 0, nil, false
}

func (p *Player) loop(ctx context.Context) {
	ticker := p.cfg.Clock.NewTicker(p.cfg.Tick)
	defer ticker.Stop()
	defer p.shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-p.events:
			switch {
			case ev.exited != nil:
				p.exited(ctx, ev.exited)
			case ev.deleted:
				p.gone(ev.pod)
			default:
				p.seen(ctx, ev.pod)
			}
		case <-ticker.C():
			p.tick()
		}
	}
}

// seen acts on the latest state of an owned pod.
func (p *Player) seen(ctx context.Context, pod *corev1.Pod) {
	p.mu.Lock()
	c := p.conts[pod.UID]
	p.mu.Unlock()
	if c == nil {
		if pod.DeletionTimestamp == nil && pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning {
			p.start(ctx, pod)
		}
		return
	}
	c.pod = pod
	select {
	case <-c.done:
		return // its end is being written
	default:
	}
	if c.ended || c.stopped != "" {
		return
	}
	switch {
	case pod.DeletionTimestamp != nil:
		p.stop(c, stopDeleted)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		// Someone else (a test) ended the pod: its container is gone too.
		p.log.Info("pod ended by another writer: killing its container", "pod", pod.Name, "phase", pod.Status.Phase)
		c.ended = true
		p.kill(c)
	case pod.Annotations[AnnotationOOMKill] != "":
		p.log.Info("OOM-killing the task container", "pod", pod.Name)
		c.stopped = stopOOM
		p.kill(c)
	default:
		p.checkDeadline(c)
	}
}

// gone stops the process of a pod that no longer exists.
func (p *Player) gone(pod *corev1.Pod) {
	p.mu.Lock()
	c := p.conts[pod.UID]
	p.mu.Unlock()
	if c == nil {
		return
	}
	c.ended = true // nothing to write to
	select {
	case <-c.done: // its process ended already (its pid may be another's now)
		p.mu.Lock()
		delete(p.conts, c.uid)
		p.mu.Unlock()
		return
	default:
	}
	if c.stopped == "" {
		p.stop(c, stopDeleted)
	}
}

// running lists the containers whose process has not exited.
func (p *Player) running() []*container {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*container
	for _, c := range p.conts {
		select {
		case <-c.done:
		default:
			out = append(out, c)
		}
	}
	return out
}

func (p *Player) tick() {
	now := p.cfg.Clock.Now()
	for _, c := range p.running() {
		if c.stopped != "" && !c.killAt.IsZero() && !now.Before(c.killAt) {
			p.log.Info("grace over: killing the container", "pod", c.name, "why", c.stopped)
			p.kill(c)
			continue
		}
		if c.stopped == "" && !c.ended {
			p.checkDeadline(c)
		}
	}
}

// checkDeadline stops a pod whose activeDeadlineSeconds has passed.
func (p *Player) checkDeadline(c *container) {
	pod := c.pod
	if pod.Spec.ActiveDeadlineSeconds == nil || pod.Status.StartTime == nil {
		return
	}
	deadline := pod.Status.StartTime.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
	if p.cfg.Clock.Now().Before(deadline) {
		return
	}
	p.log.Info("pod past its active deadline: stopping its container", "pod", pod.Name,
		"active_deadline_seconds", *pod.Spec.ActiveDeadlineSeconds)
	p.stop(c, stopDeadline)
}

// stop sends SIGTERM to the process and arms the SIGKILL of its session
// after the pod's grace.
func (p *Player) stop(c *container, why string) {
	c.stopped = why
	grace := p.cfg.MaxGrace
	if g := c.pod.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	c.killAt = p.cfg.Clock.Now().Add(grace)
	if err := unix.Kill(c.pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
		p.log.Warn("could not signal the container's process", "pod", c.name, "error", err)
	}
}

// kill SIGKILLs every process of the container's session.
func (p *Player) kill(c *container) {
	if err := killSession(c.pid); err != nil {
		p.log.Warn("could not kill the container's processes", "pod", c.name, "error", err)
	}
}

// start runs the pod's task container.
func (p *Player) start(ctx context.Context, pod *corev1.Pod) {
	spec := taskContainer(pod)
	c := &container{uid: pod.UID, name: pod.Name, container: spec.Name, pod: pod, done: make(chan struct{})}
	c.dir = filepath.Join(p.cfg.Dir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID))
	c.msgPath = filepath.Join(c.dir, "termination-log")
	err := p.spawn(ctx, c, spec)
	p.mu.Lock()
	p.conts[pod.UID] = c
	p.mu.Unlock()
	if err != nil {
		p.log.Error("could not start the task container", "pod", pod.Name, "error", err)
		close(c.done)
		c.ended = true
		p.finish(ctx, c, terminatedState{code: 128, reason: "StartError", message: err.Error()}, corev1.PodFailed, "", "")
		return
	}
	p.log.Info("task container started", "pod", pod.Name, "pid", c.pid)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		st, _ := c.cmd.Process.Wait()
		c.state = st
		close(c.done)
		select {
		case p.events <- event{exited: c}:
		case <-ctx.Done():
		}
	}()
	p.writeRunning(ctx, c)
}

func (p *Player) spawn(ctx context.Context, c *container, spec corev1.Container) error {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("making the container's directory: %w", err)
	}
	tokenFile, err := p.projectTokens(ctx, c.pod, spec, filepath.Join(c.dir, "volumes"))
	if err != nil {
		return fmt.Errorf("container %q: %w", spec.Name, err)
	}
	argv := append(append([]string(nil), spec.Command...), spec.Args...)
	if len(argv) == 0 {
		return fmt.Errorf("container %q has no command (the player pulls no image)", spec.Name)
	}
	p.mu.Lock()
	path, ok := p.commands[argv[0]]
	p.mu.Unlock()
	if !ok {
		var err error
		if path, err = exec.LookPath(argv[0]); err != nil {
			return fmt.Errorf("container %q: %w", spec.Name, err)
		}
	}
	out, err := os.OpenFile(filepath.Join(c.dir, "output.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the container's log: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(path, argv[1:]...)
	cmd.Dir = c.dir
	// The container's own env comes after the base; the player's names
	// come last, so a record path the pod spec names (the container's
	// terminationMessagePath, which does not exist here) is replaced.
	cmd.Env = append(append(append([]string(nil), p.cfg.Env...), containerEnv(c.pod, spec, p.log)...),
		"TMPDIR="+c.dir, MessagePathEnv+"="+c.msgPath)
	if tokenFile != "" {
		cmd.Env = append(cmd.Env, PodTokenEnv+"="+tokenFile)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting container %q: %w", spec.Name, err)
	}
	c.cmd, c.pid, c.startedAt = cmd, cmd.Process.Pid, p.cfg.Clock.Now()
	return nil
}

// exited writes the end of a container whose process has exited.
func (p *Player) exited(ctx context.Context, c *container) {
	// The runtime tears down the rest of the container with its PID 1.
	p.kill(c)
	if c.ended {
		p.forget(c)
		return
	}
	c.ended = true
	defer p.forget(c)
	if c.stopped == stopDeleted {
		return
	}
	st := terminatedState{code: exitCodeOf(c.state), message: readMessage(c.msgPath, p.log)}
	switch {
	case c.stopped == stopOOM:
		st.code, st.reason = 137, "OOMKilled"
	case st.code == 0:
		st.reason = "Completed"
	default:
		st.reason = "Error"
	}
	phase, reason, message := corev1.PodFailed, "", ""
	switch {
	case c.stopped == stopDeadline:
		reason, message = "DeadlineExceeded", DeadlineMessage
	case st.code == 0:
		phase = corev1.PodSucceeded
	}
	p.finish(ctx, c, st, phase, reason, message)
}

// forget drops a finished container once its pod is gone: a pod's
// container runs once.
func (p *Player) forget(c *container) {
	if c.stopped == stopDeleted {
		p.mu.Lock()
		delete(p.conts, c.uid)
		p.mu.Unlock()
	}
}

func (p *Player) shutdown() {
	for _, c := range p.running() {
		p.kill(c)
	}
}

// terminatedState is a container's terminated state.
type terminatedState struct {
	code    int32
	reason  string
	message string
}

// writeRunning writes the container running since the process started,
// unless the pod has already ended.
func (p *Player) writeRunning(ctx context.Context, c *container) {
	err := p.updateStatus(ctx, c, func(st *corev1.PodStatus) bool {
		if st.Phase != corev1.PodRunning {
			return false // never regress a pod that ended
		}
		setContainer(st, c, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}}, true)
		return true
	})
	if err != nil {
		p.log.Warn("could not write the container running", "pod", c.name, "error", err)
	}
}

// finishRetry is how long finish waits before it writes a container's end
// again after a write failed.
const finishRetry = time.Second

// finish writes the container terminated and the pod's terminal phase. As
// a kubelet's status manager does, it writes again until the end lands
// (the pod gone, or ended already, counts) or ctx ends: an API server that
// stalls past a write's bound must not leave a pod Running whose process
// is gone.
func (p *Player) finish(ctx context.Context, c *container, t terminatedState, phase corev1.PodPhase, reason, message string) {
	for {
		err := p.writeEnd(ctx, c, t, phase, reason, message)
		if err == nil {
			p.log.Info("task container ended", "pod", c.name, "exit_code", t.code, "reason", t.reason, "phase", phase)
			return
		}
		if ctx.Err() != nil {
			p.log.Error("could not write the container's end", "pod", c.name, "error", err)
			return
		}
		p.log.Warn("could not write the container's end: writing it again", "pod", c.name, "error", err)
		select {
		case <-ctx.Done():
		case <-p.cfg.Clock.After(finishRetry):
		}
	}
}

// writeEnd is one write of finish.
func (p *Player) writeEnd(ctx context.Context, c *container, t terminatedState, phase corev1.PodPhase, reason, message string) error {
	now := metav1.NewTime(p.cfg.Clock.Now())
	return p.updateStatus(ctx, c, func(st *corev1.PodStatus) bool {
		if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
			return false
		}
		setContainer(st, c, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: t.code, Reason: t.reason, Message: t.message,
			StartedAt: metav1.NewTime(c.startedAt), FinishedAt: now,
			ContainerID: "player://" + string(c.uid),
		}}, false)
		st.Phase, st.Reason, st.Message = phase, reason, message
		for i := range st.Conditions {
			if st.Conditions[i].Type == corev1.PodReady || st.Conditions[i].Type == corev1.ContainersReady {
				st.Conditions[i].Status, st.Conditions[i].Reason, st.Conditions[i].LastTransitionTime =
					corev1.ConditionFalse, "PodCompleted", now
				if phase == corev1.PodFailed {
					st.Conditions[i].Reason = "PodFailed"
				}
			}
		}
		return true
	})
}

// updateStatus applies change to the pod's fresh status and writes it
// through the status subresource, retrying conflicts. change returns false
// to write nothing.
func (p *Player) updateStatus(ctx context.Context, c *container, change func(*corev1.PodStatus) bool) error {
	pods := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cur, err := pods.Get(cctx, c.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading pod %s: %w", c.name, err)
		}
		if cur.UID != c.uid || !change(&cur.Status) {
			return nil
		}
		_, err = pods.UpdateStatus(cctx, cur, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// setContainer sets the task container's state in st.
func setContainer(st *corev1.PodStatus, c *container, state corev1.ContainerState, ready bool) {
	for i := range st.ContainerStatuses {
		if st.ContainerStatuses[i].Name == c.container {
			cs := &st.ContainerStatuses[i]
			cs.State, cs.Ready = state, ready
			started := ready
			cs.Started = &started
			return
		}
	}
	started := ready
	st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.container, State: state,
		Ready: ready, Started: &started, Image: c.pod.Spec.Containers[0].Image})
}

// taskContainer is the container the player runs.
func taskContainer(pod *corev1.Pod) corev1.Container {
	for _, c := range pod.Spec.Containers {
		if c.Name == TaskContainer {
			return c
		}
	}
	return pod.Spec.Containers[0]
}

// containerEnv is the container's environment: literal values, and the
// downward-API fields metadata.name, metadata.namespace, metadata.uid,
// spec.nodeName, status.podIP, metadata.labels['k'] and
// metadata.annotations['k']. Any other source is left out (logged).
func containerEnv(pod *corev1.Pod, spec corev1.Container, log hclog.Logger) []string {
	var env []string
	for _, e := range spec.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
			continue
		}
		if e.ValueFrom.FieldRef != nil {
			if v, ok := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath); ok {
				env = append(env, e.Name+"="+v)
				continue
			}
		}
		log.Warn("env source not simulated: variable left out", "pod", pod.Name, "name", e.Name)
	}
	return env
}

func fieldValue(pod *corev1.Pod, path string) (string, bool) {
	switch path {
	case "metadata.name":
		return pod.Name, true
	case "metadata.namespace":
		return pod.Namespace, true
	case "metadata.uid":
		return string(pod.UID), true
	case "spec.nodeName":
		return pod.Spec.NodeName, true
	case "status.podIP":
		return pod.Status.PodIP, true
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if strings.HasPrefix(path, prefix+"['") && strings.HasSuffix(path, "']") {
			return m[strings.TrimSuffix(strings.TrimPrefix(path, prefix+"['"), "']")], true
		}
	}
	return "", false
}

// readMessage reads the termination message the process left, truncated
// to what the kubelet keeps.
func readMessage(path string, log hclog.Logger) string {
	data, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("could not read the termination message", "path", path, "error", err)
		}
		return ""
	}
	if len(data) > MaxMessageBytes {
		data = data[:MaxMessageBytes]
	}
	return string(data)
}

// exitCodeOf is the container's exit code: the process's, or 128+signal.
func exitCodeOf(st *os.ProcessState) int32 {
	if st == nil {
		return 137
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int32(128 + int(ws.Signal()))
	}
	return int32(st.ExitCode())
}
