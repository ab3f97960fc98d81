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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dexaflow/reaper/sdk"
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

func TestPodName(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "Run_2030.01.02", TaskID: "load_a", Try: 2, Epoch: 3}
	if PodName(a) != PodName(a) {
		t.Fatal("the name of one attempt changed")
	}
	others := []sdk.Attempt{
		{RunID: a.RunID, TaskID: "load-a", Try: 2, Epoch: 3}, // the same task label
		{RunID: a.RunID, TaskID: "Load_a", Try: 2, Epoch: 3},
		{RunID: a.RunID, TaskID: a.TaskID, Try: 3, Epoch: 3},
		{RunID: a.RunID, TaskID: a.TaskID, Try: 2, Epoch: 4},
	}
	for _, o := range others {
		if PodName(o) == PodName(a) {
			t.Errorf("%s and %s share the pod name %s", a, o, PodName(a))
		}
	}
	long := sdk.Attempt{RunID: strings.Repeat("r", 200), TaskID: "-" + strings.Repeat("T.", 100), Try: 99999, Epoch: 99999}
	for _, x := range append(others, a, long, sdk.Attempt{RunID: "-", TaskID: "_", Try: 1}) {
		if errs := validation.IsDNS1123Label(PodName(x)); len(errs) > 0 {
			t.Errorf("pod name %q of %s: %v", PodName(x), x, errs)
		}
	}
}
