package kuberunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

func TestActiveDeadline(t *testing.T) {
	t.Parallel()
	const (
		lost    = 3 * time.Minute
		grace   = 30 * time.Second
		ceiling = time.Hour
	)
	cases := map[string]struct {
		timeout, lost, grace, ceiling time.Duration
		want                          int64
		none                          bool
	}{
		"TimeoutPlusDispatchLostPlusGrace":       {timeout: 10 * time.Minute, lost: lost, grace: grace, ceiling: ceiling, want: 600 + 180 + 30},
		"GraceAddsAtMostSixtySeconds":            {timeout: time.Minute, lost: lost, grace: time.Hour, ceiling: ceiling, want: 60 + 180 + 60},
		"NoGraceAddsNothing":                     {timeout: time.Minute, lost: lost, ceiling: ceiling, want: 60 + 180},
		"PartSecondsRoundUp":                     {timeout: 1500 * time.Millisecond, lost: lost, grace: grace, ceiling: ceiling, want: 2 + 180 + 30},
		"TheSumIsClampedToMaxInt32":              {timeout: math.MaxInt32 * time.Second, lost: lost, grace: grace, ceiling: ceiling, want: math.MaxInt32},
		"TheSumJustUnderTheClampIsKept":          {timeout: (math.MaxInt32 - 240) * time.Second, lost: lost, grace: grace, ceiling: ceiling, want: math.MaxInt32 - 30},
		"ATimeoutLongerThanTheCeilingSetsIt":     {timeout: 2 * time.Hour, lost: lost, grace: grace, ceiling: ceiling, want: 7200 + 180 + 30},
		"NoTimeoutTakesTheCeilingAsItsFloor":     {lost: lost, grace: grace, ceiling: ceiling, want: 3600},
		"NoTimeoutAndACeilingPastTheClamp":       {lost: lost, grace: grace, ceiling: 100 * 365 * 24 * time.Hour, want: math.MaxInt32},
		"NoTimeoutAndNoCeilingHasNoDeadline":     {lost: lost, grace: grace, none: true},
		"NoTimeoutAndANegativeCeilingHasNoneToo": {lost: lost, grace: grace, ceiling: -time.Second, none: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, ok := ActiveDeadline(c.timeout, c.lost, c.grace, c.ceiling)
			if ok == c.none || (ok && got != c.want) {
				t.Fatalf("got %d (deadline %v), want %d (deadline %v)", got, ok, c.want, !c.none)
			}
		})
	}
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	pods := schema.GroupResource{Resource: "pods"}
	urlErr := func(err error) error { return &url.Error{Op: "Post", URL: "https://127.0.0.1:1/api/v1/pods", Err: err} }
	cases := map[string]struct {
		err  error
		want bool
	}{
		"ServiceUnavailable503":        {apierrors.NewServiceUnavailable("etcd leader change"), true},
		"InternalError500":             {apierrors.NewInternalError(errors.New("webhook unreachable")), true},
		"ServerTimeout":                {apierrors.NewServerTimeout(pods, "create", 1), true},
		"GatewayTimeout504":            {apierrors.NewTimeoutError("request timed out", 1), true},
		"TooManyRequests429":           {apierrors.NewTooManyRequests("slow down", 1), true},
		"BadGateway502":                {apierrors.NewGenericServerResponse(502, "POST", pods, "", "", 0, false), true},
		"ConnectionRefused":            {urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), true},
		"ConnectionReset":              {urlErr(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		"AnswerCutShort":               {urlErr(io.ErrUnexpectedEOF), true},
		"ClientTimeout":                {urlErr(context.DeadlineExceeded), true},
		"NetworkTimeout":               {urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}), true},
		"HostUnreachable":              {urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}), true},
		"AddressDidNotResolve":         {urlErr(&net.DNSError{Err: "no such host", Name: "api.example", IsNotFound: true}), true},
		"InvalidSpec422IsARefusal":     {apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "bad")}), false},
		"Forbidden403IsARefusal":       {apierrors.NewForbidden(pods, "p", errors.New("no create")), false},
		"QuotaExceededIsARefusal":      {apierrors.NewForbidden(pods, "p", errors.New("exceeded quota")), false},
		"Unauthorized401IsARefusal":    {apierrors.NewUnauthorized("bad token"), false},
		"NoNamespace404IsARefusal":     {apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "gone"), false},
		"BadRequest400IsARefusal":      {apierrors.NewBadRequest("bad"), false},
		"AlreadyExists409IsARefusal":   {apierrors.NewAlreadyExists(pods, "p"), false},
		"AnUnknownErrorIsARefusal":     {fmt.Errorf("something else"), false},
		"ACancelledCallIsNoOutageSign": {urlErr(context.Canceled), false},
		"NoErrorIsNotUnavailable":      {nil, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := Unavailable(c.err); got != c.want {
				t.Fatalf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestPodName: a pod's name is the readable part of its attempt, then a
// hash of the exact attempt and the dispatch; the same for the same
// attempt and dispatch (a create repeated by the client meets its own
// pod), different for another dispatch of the same attempt (nobody who
// knows the attempt knows the name) and for any other attempt, and a DNS
// label.
func TestPodName(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "Run_2030.01.02", TaskID: "load_a", Try: 2, Epoch: 3}
	d := NewDispatch()
	if PodName(a, d) != PodName(a, d) {
		t.Fatal("the name of one attempt and dispatch changed")
	}
	if !strings.HasPrefix(PodName(a, d), "run-2030-01-02-load-a-2-3-") {
		t.Errorf("pod name %q: want the readable run, task, try and epoch first", PodName(a, d))
	}
	if PodName(a, NewDispatch()) == PodName(a, d) || PodName(a, "") == PodName(a, d) {
		t.Errorf("another dispatch of %s has the pod name %s", a, PodName(a, d))
	}
	others := []sdk.Attempt{
		{RunID: a.RunID, TaskID: "load-a", Try: 2, Epoch: 3}, // the same task label
		{RunID: a.RunID, TaskID: "Load_a", Try: 2, Epoch: 3},
		{RunID: a.RunID, TaskID: a.TaskID, Try: 3, Epoch: 3},
		{RunID: a.RunID, TaskID: a.TaskID, Try: 2, Epoch: 4},
	}
	for _, o := range others {
		if PodName(o, d) == PodName(a, d) {
			t.Errorf("%s and %s share the pod name %s", a, o, PodName(a, d))
		}
	}
	long := sdk.Attempt{RunID: strings.Repeat("r", 200), TaskID: "-" + strings.Repeat("T.", 100), Try: 99999, Epoch: 99999}
	for _, x := range append(others, a, long, sdk.Attempt{RunID: "-", TaskID: "_", Try: 1}) {
		if errs := validation.IsDNS1123Label(PodName(x, d)); len(errs) > 0 {
			t.Errorf("pod name %q of %s: %v", PodName(x, d), x, errs)
		}
	}
}

// TestEachBuildOfAnAttemptsPodHasANameOfItsOwn: every pod BuildPod makes
// carries a dispatch of its own (AnnotationDispatch) and the name PodName
// gives the attempt and that dispatch, so two builds of one attempt never
// share a name and the name cannot be computed from the attempt.
func TestEachBuildOfAnAttemptsPodHasANameOfItsOwn(t *testing.T) {
	t.Parallel()
	ti := board.TaskInstance{Attempt: sdk.Attempt{RunID: "run", TaskID: "t", Try: 1}, Command: "true"}
	seen := map[string]bool{}
	for range 100 {
		p := BuildPod(PodSpec{Namespace: "ns", Image: "img", AgentPath: "reaper-agent"}, ti, nil)
		d := p.Annotations[AnnotationDispatch]
		if len(d) < 26 || p.Name != PodName(ti.Attempt, d) {
			t.Fatalf("pod %s with dispatch %q: want at least 128 random bits and PodName of them", p.Name, d)
		}
		if seen[p.Name] || seen[d] {
			t.Fatalf("pod name %s or dispatch %s built twice", p.Name, d)
		}
		seen[p.Name], seen[d] = true, true
	}
}

// TestNotOurs: a pod met under the attempt's pod name is the runner's own
// only when its labels and raw task id name exactly the attempt and it
// carries this create's dispatch value while the attempt records no pod,
// or its UID is the one the attempt records. Labels copied from the
// attempt prove nothing.
func TestNotOurs(t *testing.T) {
	t.Parallel()
	ti := board.TaskInstance{Attempt: sdk.Attempt{RunID: "run", TaskID: "load_a", Try: 1, Epoch: 2}, Command: "true"}
	want := BuildPod(PodSpec{Namespace: "ns", Image: "img", AgentPath: "reaper-agent"}, ti, nil)
	pod := func(edit func(p *corev1.Pod)) *corev1.Pod {
		p := want.DeepCopy()
		p.UID = "uid-1"
		edit(p)
		return p
	}
	for name, c := range map[string]struct {
		got      *corev1.Pod
		recorded string
		ours     bool
	}{
		"ThisCreatesOwnPod":                {pod(func(*corev1.Pod) {}), "", true},
		"TheRecordedPod":                   {pod(func(p *corev1.Pod) { delete(p.Annotations, AnnotationDispatch) }), "uid-1", true},
		"Unlabelled":                       {pod(func(p *corev1.Pod) { p.Labels = nil }), "", false},
		"TheAttemptsLabelsWithoutTheValue": {pod(func(p *corev1.Pod) { delete(p.Annotations, AnnotationDispatch) }), "", false},
		"TheAttemptsLabelsAndAnotherValue": {pod(func(p *corev1.Pod) { p.Annotations[AnnotationDispatch] = NewDispatch() }), "", false},
		"AnotherEpoch":                     {pod(func(p *corev1.Pod) { p.Labels[kube.LabelAttemptEpoch] = "3" }), "", false},
		"AnotherTaskOfTheSameLabel":        {pod(func(p *corev1.Pod) { p.Annotations[kube.AnnotationRawTaskID] = "load-a" }), "", false},
		"TheValueButAnotherRecordedUID":    {pod(func(*corev1.Pod) {}), "uid-2", false},
		"TheRecordedUIDOfAnotherAttempt":   {pod(func(p *corev1.Pod) { p.Labels[kube.LabelTryNumber] = "2" }), "uid-1", false},
	} {
		t.Run(name, func(t *testing.T) {
			why := notOurs(c.got, want, c.recorded)
			if (why == "") != c.ours {
				t.Fatalf("notOurs = %q, want ours %v", why, c.ours)
			}
		})
	}
}
