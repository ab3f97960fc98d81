package kube

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/dexaflow/reaper/sdk"
)

// Kubernetes Events. Each task pod the substrate stops in place or deletes
// (teardown.go), and each whose attempt the sweep settles from the pod's
// record or the cluster's word (sweep.go), gets an Event of the
// events.k8s.io API regarding that pod (its name and UID), so that
// `kubectl describe pod` and `kubectl get events` say what reaperd did and
// why:
//
//   - reason: the decision label (the teardown's reason, such as
//     agent_lost or pod_lost; reconcile_settled or reconcile_infra_override
//     for a settlement; the board's refusal label for a RESCHEDULE record
//     it failed instead);
//   - action: EventActionStop, EventActionDelete or EventActionSettle;
//   - note: what was done, and the attempt (run, task, try, epoch), made
//     safe and bounded (sdk.SafeText): run and task ids are tenants' text;
//   - type: Warning where a failure is recorded (a teardown for a label
//     that fails its attempt, a delete that replaced a refused stop in
//     place, a settlement FAILED or INFRA), Normal otherwise.
//
// A pod reaperd does not own (foreign.go) gets none: the callers record
// only for pods they acted on, and those are reaperd's.
//
// Events are best-effort. client-go's events broadcaster writes them on
// goroutines of its own, aggregating repeats of one event on one pod into
// a series (one Event object whose series count grows), through a client
// of their own whose rate is bounded apart from the substrate's (an Event
// never waits for, nor delays, a teardown's or the sweep's calls). Above
// eventsQPS (bursts of eventsBurst) an Event is dropped. A write that
// fails, and a drop, is counted and logged once, when the first of a
// streak happens (and once when the streak ends); nothing waits on an
// Event, and nothing fails for one. The broadcaster is the substrate's:
// it starts with Configure and stops with Close (or a new Configure).

// EventsController is the reporting controller of the substrate's Events
// (the "From" kubectl shows).
const EventsController = "reaperd"

// The actions of the substrate's Events.
const (
	// EventActionStop: a teardown stopped the pod in place (its
	// activeDeadlineSeconds lowered to 1).
	EventActionStop = "StopInPlace"
	// EventActionDelete: a teardown deleted the pod, pinned by its UID.
	EventActionDelete = "Delete"
	// EventActionSettle: the sweep settled the pod's attempt.
	EventActionSettle = "Settle"
)

// EventReasonTeardown is the reason of a teardown's Event when its request
// named no decision label.
const EventReasonTeardown = "reap_teardown"

const (
	// eventsQPS and eventsBurst bound the Events recorded (more are
	// dropped) and the requests of the Events' own client. A mass teardown
	// of 10,000 pods (about 400 s at the default qps) records an Event for
	// the first hundred and about two pods in five after.
	eventsQPS   = 10
	eventsBurst = 100
	// maxEventNoteBytes is the API server's bound on an Event's note;
	// the substrate's notes are far shorter, save for tenants' ids.
	maxEventNoteBytes = 1024
	// maxEventReasonBytes is the API server's bound on an Event's reason.
	maxEventReasonBytes = 128
)

// eventer records the substrate's Events. A nil eventer (events = false)
// records nothing.
type eventer struct {
	log      hclog.Logger
	bc       events.EventBroadcaster
	rec      events.EventRecorder
	cancel   context.CancelFunc
	limit    flowcontrol.PassiveRateLimiter
	sink     *meteredSink
	stopOnce sync.Once
	emitted  atomic.Int64 // handed to the broadcaster
	dropped  streak       // refused by the rate limit
}

// startEvents starts the broadcaster writing through client (the Events'
// own) and a recorder that takes at most qps Events a second, in bursts of
// burst.
func startEvents(client kubernetes.Interface, qps float32, burst int, log hclog.Logger) (*eventer, error) {
	sink := &meteredSink{inner: &events.EventSinkImpl{Interface: client.EventsV1()}, log: log}
	bc := events.NewBroadcaster(sink)
	// The broadcaster logs each failed write through klog; the sink counts
	// them and logs them here instead, once a streak.
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	if err := bc.StartRecordingToSinkWithContext(ctx); err != nil {
		cancel()
		bc.Shutdown()
		return nil, fmt.Errorf("starting the Kubernetes Events broadcaster: %w", err)
	}
	return &eventer{log: log, bc: bc, rec: bc.NewRecorder(scheme.Scheme, EventsController), cancel: cancel,
		limit: flowcontrol.NewTokenBucketPassiveRateLimiter(qps, burst), sink: sink}, nil
}

// stop shuts the broadcaster down: its goroutines end, a write in flight
// is cancelled, and Events not yet written are abandoned.
func (e *eventer) stop() {
	if e == nil {
		return
	}
	e.stopOnce.Do(func() {
		e.bc.Shutdown()
		e.cancel()
	})
}

// record hands one Event regarding pod p to the broadcaster, unless the
// rate limit drops it. It never blocks.
func (e *eventer) record(p *pod, warning bool, reason, action, note string) {
	if e == nil {
		return
	}
	if reason == "" {
		reason = EventReasonTeardown
	}
	if !e.limit.TryAccept() {
		if e.dropped.fail() {
			e.log.Warn("kube: Kubernetes Events dropped by their rate limit; counted until one is recorded again",
				"qps", eventsQPS, "burst", eventsBurst, "pod", p.Name, "reason", reason)
		}
		return
	}
	if n, ended := e.dropped.ok(); ended {
		e.log.Info("kube: Kubernetes Events recorded again after drops", "dropped", n)
	}
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
	e.emitted.Add(1)
	e.rec.Eventf(ref, nil, typ, sdk.SafeText(reason, maxEventReasonBytes), action, "%s",
		sdk.SafeText(note, maxEventNoteBytes))
}

// eventCounts is what an eventer did so far: Events handed to the
// broadcaster, dropped by the rate limit, and writes that failed.
type eventCounts struct{ emitted, dropped, failed int64 }

func (e *eventer) counts() eventCounts {
	if e == nil {
		return eventCounts{}
	}
	return eventCounts{emitted: e.emitted.Load(), dropped: e.dropped.count(), failed: e.sink.failed.count()}
}

// attemptNote names attempt a in an Event's note.
func attemptNote(a sdk.Attempt) string {
	return "attempt run " + a.RunID + ", task " + a.TaskID + ", try " + strconv.Itoa(int(a.Try)) +
		", epoch " + strconv.Itoa(int(a.Epoch))
}

// podAttemptNote names the attempt pod p's labels name, or only its run
// when they name none (a run's teardown acts on every pod of the run).
func podAttemptNote(p *pod) string {
	if a, ok := p.labels.attempt(); ok {
		return attemptNote(a)
	}
	return "run " + p.labels.run
}

// teardownWarns: a teardown of one attempt follows the mark that failed it
// (agent_lost, pod_lost, ...; a reaper tears down only the attempt it
// marked, and an owed teardown retries one), a failure recorded, so a
// Warning. A run's teardown (orphan_run: a run with nothing left alive)
// records none. The request says which, whatever label a plugin declared.
func teardownWarns(req sdk.TeardownRequest) bool { return req.Attempt != nil }

// settleWarns: a settlement records a failure.
func settleWarns(o sdk.Outcome) bool { return o == sdk.OutcomeFailed || o == sdk.OutcomeInfra }

// meteredSink writes Events through inner, counting the writes that fail
// and logging the first of each streak of failures, with its error, and
// the streak's end. A patch that finds no Event (its series' first Event
// expired) and a create that finds one already there are the
// broadcaster's ordinary path, not failures; nor is a write cut short by
// the broadcaster's stop.
type meteredSink struct {
	inner  events.EventSink
	log    hclog.Logger
	failed streak
}

var _ events.EventSink = (*meteredSink)(nil)

func (s *meteredSink) Create(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out, err := s.inner.Create(ctx, ev)
	s.note(ctx, ev, err, apierrors.IsAlreadyExists(err))
	return out, err
}

func (s *meteredSink) Update(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out, err := s.inner.Update(ctx, ev)
	s.note(ctx, ev, err, false)
	return out, err
}

func (s *meteredSink) Patch(ctx context.Context, ev *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	out, err := s.inner.Patch(ctx, ev, data)
	s.note(ctx, ev, err, apierrors.IsNotFound(err))
	return out, err
}

// note counts and logs one write's result; an expected error counts as
// neither a failure nor a success.
func (s *meteredSink) note(ctx context.Context, ev *eventsv1.Event, err error, expected bool) {
	switch {
	case expected || (err != nil && ctx.Err() != nil):
	case err != nil:
		if s.failed.fail() {
			s.log.Warn("kube: recording a Kubernetes Event failed; further failures are counted until one succeeds "+
				"(reaperd's Role needs create and patch on events.k8s.io events in the task namespace)",
				"pod", ev.Regarding.Name, "reason", ev.Reason, "error", err)
		}
	default:
		if n, ended := s.failed.ok(); ended {
			s.log.Info("kube: recording Kubernetes Events works again", "failed", n)
		}
	}
}

// streak counts failures and tells the first of each run of them, and
// the run's end, so that each is logged once.
type streak struct {
	mu      sync.Mutex
	total   int64
	failing bool
	begun   int64 // total when the run began
}

// fail counts one failure; first: it begins a run.
func (s *streak) fail() (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if s.failing {
		return false
	}
	s.failing, s.begun = true, s.total-1
	return true
}

// ok ends the run of failures, if one is on; n is its length.
func (s *streak) ok() (n int64, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failing {
		return 0, false
	}
	s.failing = false
	return s.total - s.begun, true
}

func (s *streak) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
