package kuberunner

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// The task container's outcome record: the agent writes it to this file,
// and the kubelet copies the file into the container's termination message
// (policy File: never the logs, which are not a record), where the
// substrate's reconciler reads it.
const (
	TerminationMessagePath   = "/dev/termination-log"
	TerminationMessagePolicy = corev1.TerminationMessageReadFile
	// EnvRecordFile names, in the task container's environment, the file
	// the agent writes its outcome record to.
	EnvRecordFile = "REAPER_RECORD_FILE"
)

// MaxActiveDeadline is the largest activeDeadlineSeconds the API server
// accepts (math.MaxInt32).
const MaxActiveDeadline = math.MaxInt32

// GraceCap is the most of the pod's termination grace the deadline
// arithmetic adds (the pod spec still carries the declared grace).
const GraceCap = 60 * time.Second

// ActiveDeadline is the activeDeadlineSeconds of a task pod. A task with a
// timeout gets its timeout, plus the dispatch-lost threshold as startup
// headroom (the kubelet counts from the pod's start, before the image pull
// and the agent's own start-up), plus the pod's termination grace capped
// at GraceCap for the shutdown tail. A task without one gets the credential
// ceiling itself, with no headroom: nothing inside the pod races it. The
// result is clamped to MaxActiveDeadline; each term is counted in whole
// seconds, rounded up. ok is false when the pod gets no deadline at all: no
// timeout and a non-positive ceiling, which disables the floor.
func ActiveDeadline(timeout, dispatchLost, grace, ceiling time.Duration) (seconds int64, ok bool) {
	if timeout <= 0 {
		if ceiling <= 0 {
			return 0, false
		}
		return min(ceilSeconds(ceiling), MaxActiveDeadline), true
	}
	s := ceilSeconds(timeout) + ceilSeconds(max(dispatchLost, 0)) + ceilSeconds(min(max(grace, 0), GraceCap))
	if s < 0 || s > MaxActiveDeadline { // s < 0: overflowed
		s = MaxActiveDeadline
	}
	return s, true
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

var notName = regexp.MustCompile(`[^a-z0-9-]+`)

// namePart makes s a piece of a pod name: lowercase, only [a-z0-9-], at
// most n characters, no leading or trailing dash.
func namePart(s string, n int) string {
	s = notName.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > n {
		s = s[:n]
	}
	return strings.Trim(s, "-")
}

// AnnotationDispatch is the annotation that carries, on a task pod, the
// dispatch that made it: a value drawn at random for each create (see
// BuildPod), which nobody knows before the pod exists. It is how the
// runner tells the pod its own create made, when that create's answer was
// lost and the repeated create met the pod, from one someone else put
// under the name.
const AnnotationDispatch = "leoflow.io/dispatch"

// podNameSuffixLen is how many hex characters of the dispatch's hash end a
// pod name (48 bits).
const podNameSuffixLen = 12

// PodName is the pod name of attempt a made by dispatch (the value of
// AnnotationDispatch): a readable part (the run and task ids lowercased and
// cut short, the try and the epoch), for kubectl users, then a hash of the
// exact attempt and the dispatch. The dispatch is drawn at random for each
// create, so the name cannot be known before the pod exists: nobody can
// take an attempt's pod name first. The same attempt and dispatch give the
// same name (a create repeated by the client meets AlreadyExists rather
// than making a second pod). It fits a DNS label (63 characters), so the
// pod's hostname is its name. The name is recorded on the attempt with the
// pod's UID (lifecycle.Writer.RecordCreatedPod).
func PodName(a sdk.Attempt, dispatch string) string {
	sum := sha256.Sum256([]byte(a.RunID + "\x00" + a.TaskID + "\x00" +
		strconv.Itoa(int(a.Try)) + "\x00" + strconv.Itoa(int(a.Epoch)) + "\x00" + dispatch))
	tail := strconv.Itoa(int(a.Try)) + "-" + strconv.Itoa(int(a.Epoch)) + "-" + hex.EncodeToString(sum[:])[:podNameSuffixLen]
	head := namePart(a.RunID, 20) + "-" + namePart(a.TaskID, 20)
	name := strings.Trim(namePart(head, 63-len(tail)-1), "-") + "-" + tail
	return strings.TrimLeft(name, "-")
}

// NewDispatch draws the value of AnnotationDispatch for one create: 128
// random bits.
func NewDispatch() string { return strings.ToLower(rand.Text()) }

// PodSpec is what a runner's configuration says of every task pod.
type PodSpec struct {
	Namespace      string
	Image          string
	AgentPath      string // the reaper-agent binary inside the image
	ServiceAccount string
	// TokenAudience is the audience of the pods' projected token (see
	// projectPodToken).
	TokenAudience string
	Resources     corev1.ResourceRequirements
	PullPolicy    corev1.PullPolicy // "": the API server's default
	// TerminationGrace is the pod's terminationGracePeriodSeconds, carried
	// verbatim.
	TerminationGrace time.Duration
	// Heartbeat is the agent's heartbeat interval.
	Heartbeat time.Duration
	// DispatchLost and CredentialCeiling feed ActiveDeadline.
	DispatchLost      time.Duration
	CredentialCeiling time.Duration
	// Hardening is the pods' security context (see harden).
	Hardening Hardening
}

// BuildPod is the pod of the task instance's attempt, for one create: its
// attempt labels and raw task id annotation (kube.AttemptLabels), a new
// dispatch (NewDispatch) in AnnotationDispatch and the name PodName gives
// the attempt and that dispatch, the outcome record
// finalizer (kube.FinalizerOutcomeRecord), one task container named
// kube.TaskContainer running the agent for the attempt with the outcome
// record path set, never restarted, and the deadline of ActiveDeadline,
// hardened (no service-account token, non-root, no capability, read-only
// root; see harden). env is added to the container's environment (the
// attempt's credential).
func BuildPod(spec PodSpec, ti board.TaskInstance, env []corev1.EnvVar) *corev1.Pod {
	return BuildPodFor(spec, ti, env, NewDispatch())
}

// BuildPodFor is BuildPod for the dispatch given (NewDispatch): the runner
// draws it first, to record the pod's name on the attempt before the
// create (lifecycle.Writer.QueuePod).
func BuildPodFor(spec PodSpec, ti board.TaskInstance, env []corev1.EnvVar, dispatch string) *corev1.Pod {
	a := ti.Attempt
	lbls, ann := kube.AttemptLabels(a)
	ann[AnnotationDispatch] = dispatch
	inv := agent.Invocation{
		Attempt:          a,
		Command:          ti.Command,
		ExecutionTimeout: ti.ExecutionTimeout,
		Heartbeat:        spec.Heartbeat,
		Reporter:         agent.ReporterAPI,
	}
	if ti.Sensor.Declared {
		// Only a sensor's poke may ask for the next one.
		inv.RescheduleExitCode = agent.SensorRescheduleExitCode
	}
	grace := ceilSeconds(spec.TerminationGrace)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: PodName(a, dispatch), Namespace: spec.Namespace, Labels: lbls, Annotations: ann,
			// Whoever deletes the pod leaves its object, and its outcome
			// record, until the substrate's sweep has read it.
			Finalizers: []string{kube.FinalizerOutcomeRecord},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ServiceAccountName:            spec.ServiceAccount,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:                     kube.TaskContainer,
				Image:                    spec.Image,
				ImagePullPolicy:          spec.PullPolicy,
				Command:                  []string{spec.AgentPath},
				Args:                     inv.Args(),
				Env:                      append([]corev1.EnvVar{{Name: EnvRecordFile, Value: TerminationMessagePath}}, env...),
				Resources:                spec.Resources,
				TerminationMessagePath:   TerminationMessagePath,
				TerminationMessagePolicy: TerminationMessagePolicy,
			}},
		},
	}
	if s, ok := ActiveDeadline(ti.ExecutionTimeout, spec.DispatchLost, spec.TerminationGrace, spec.CredentialCeiling); ok {
		pod.Spec.ActiveDeadlineSeconds = &s
	}
	harden(spec.Hardening, pod, &pod.Spec.Containers[0])
	projectPodToken(pod, &pod.Spec.Containers[0], spec.TokenAudience)
	return pod
}

// MadeFor reports whether p is the pod a create for attempt a made under
// name: it is under that name, and the dispatch value it carries is the
// one name was made from (PodName). Nobody can make such a pod but the
// runner that drew the value: the name is only known, on the board, once
// the runner recorded it to create the pod.
func MadeFor(p *corev1.Pod, a sdk.Attempt, name string) bool {
	d := p.Annotations[AnnotationDispatch]
	return p.Name == name && d != "" && PodName(a, d) == name
}
