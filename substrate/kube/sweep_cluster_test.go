package kube

// The sweep's rules against the real API server and the Postgres board.
// KWOK runs the pods; what a kubelet writes when a container ends (its
// terminated state and termination message, an eviction, a disruption
// condition) the test writes through the status subresource.

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// sweepEnv is an env with a board whose lease this test holds.
type sweepEnv struct {
	*env
	store *board.Store
	w     *lifecycle.Writer
	term  int64
	runs  map[string]bool
}

func newSweepEnv(t *testing.T) *sweepEnv {
	t.Helper()
	e := newEnv(t)
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{CredentialCeiling: ladder.Defaults().CredentialCeiling})
	lease, ok, err := store.TryAcquire(context.Background(), "sweep-test", 24*time.Hour, time.Now().Add(-time.Hour))
	if err != nil || !ok {
		t.Fatalf("taking the board's lease: %v, %v", ok, err)
	}
	return &sweepEnv{env: e, store: store, w: lifecycle.New(pool, lifecycle.Options{}), term: lease.Term, runs: map[string]bool{}}
}

// scheduled puts a's task instance of the given executor on the board (its
// run first, once), as of ten minutes ago, and returns that time.
func (s *sweepEnv) scheduled(a sdk.Attempt, executor string) time.Time {
	s.t.Helper()
	ctx := context.Background()
	now := time.Now().Add(-10 * time.Minute)
	if !s.runs[a.RunID] {
		if err := s.w.CreateRun(ctx, lifecycle.NewRun{RunID: a.RunID, DagID: "dag"}, now); err != nil {
			s.t.Fatal(err)
		}
		s.runs[a.RunID] = true
	}
	if _, err := s.store.Pool().Exec(ctx, `INSERT INTO task_instances (run_id, task_id, executor, retries, max_retries,
        infra_budget, try_number, attempt_epoch, updated_at) VALUES ($1, $2, $6, 2, 2, 3, $3, $4, $5)`,
		a.RunID, a.TaskID, a.Try, a.Epoch, now, executor); err != nil {
		s.t.Fatal(err)
	}
	return now
}

// runningOnBoard drives attempt a (a fresh first attempt of a kube task)
// to running on the board.
func (s *sweepEnv) runningOnBoard(a sdk.Attempt) {
	s.t.Helper()
	ctx, now := context.Background(), s.scheduled(a, sdk.ExecutorKube)
	for _, step := range []func(context.Context, sdk.Attempt, time.Time) (bool, error){s.w.Enqueue, s.w.Queue} {
		if ok, err := step(ctx, a, now); err != nil || !ok {
			s.t.Fatalf("driving %s to queued: %v, %v", a, ok, err)
		}
	}
	if stop, err := s.w.Running(ctx, a, now); err != nil || stop {
		s.t.Fatalf("driving %s to running: %v, %v", a, stop, err)
	}
}

// sensor declares a's task a sensor with the given timeout whose try first
// poked at firstPoke.
func (s *sweepEnv) sensor(a sdk.Attempt, timeout time.Duration, firstPoke time.Time) {
	s.t.Helper()
	if _, err := s.store.Pool().Exec(context.Background(), `UPDATE task_instances
        SET sensor = true, sensor_timeout_seconds = $3, first_poke_at = $4 WHERE run_id = $1 AND task_id = $2`,
		a.RunID, a.TaskID, int32(timeout/time.Second), firstPoke); err != nil {
		s.t.Fatal(err)
	}
}

// mark puts a provisional infra mark for reason on a, made at at.
func (s *sweepEnv) mark(a sdk.Attempt, reason string, at time.Time) {
	s.t.Helper()
	res, err := s.store.Mark(context.Background(), []sdk.Mark{{Attempt: a, FromStates: []string{sdk.StateRunning},
		Kind: sdk.MarkInfra, Reason: reason, Message: reason + ": test", Term: s.term, At: at}})
	if err != nil || !res[0].Applied {
		s.t.Fatalf("marking %s: %+v, %v", a, res, err)
	}
}

func (s *sweepEnv) row(a sdk.Attempt) board.TaskInstance {
	s.t.Helper()
	ti, err := s.store.TaskInstance(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		s.t.Fatal(err)
	}
	return ti
}

func (s *sweepEnv) log(a sdk.Attempt) []string {
	s.t.Helper()
	lines, err := s.store.AttemptLog(context.Background(), a.RunID, a.TaskID)
	if err != nil {
		s.t.Fatal(err)
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.Line
	}
	return out
}

// sweep runs one sweep at now once the cache shows pod name in phase (""
// skips the wait).
func (s *sweepEnv) sweep(now time.Time) sdk.SweepResult {
	s.t.Helper()
	s.synced(s.sub)
	res, err := s.sub.Sweep(context.Background(), sdk.SweepRequest{Now: now, Term: s.term, Ladder: ladder.Defaults()}, s.store)
	if err != nil {
		s.t.Fatal(err)
	}
	return res
}

// finished makes a's pod (mutate adjusting it first), runs it, and plays
// the kubelet ending it with status; it waits until the cache holds the
// finished pod.
func (s *sweepEnv) finished(a sdk.Attempt, phase corev1.PodPhase, status func(*corev1.PodStatus), mutate ...func(*corev1.Pod)) *corev1.Pod {
	s.t.Helper()
	p := s.running(a, mutate...)
	p = s.playStatus(p.Name, func(st *corev1.PodStatus) {
		st.Phase = phase
		status(st)
	})
	s.cachedPhase(s.sub, a, p.Name, phase)
	return p
}

func disruptedBy(reason string) func(*corev1.PodStatus) {
	return func(st *corev1.PodStatus) {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: reason, LastTransitionTime: metav1.Now()})
	}
}

func both(fs ...func(*corev1.PodStatus)) func(*corev1.PodStatus) {
	return func(st *corev1.PodStatus) {
		for _, f := range fs {
			f(st)
		}
	}
}

func wantRow(t *testing.T, ti board.TaskInstance, state, kind, msgPrefix string, confirmed bool) {
	t.Helper()
	if ti.State != state || ti.LastFailureKind != kind || !strings.HasPrefix(ti.ErrorMessage, msgPrefix) ||
		ti.InfraConfirmedAt.IsZero() == confirmed {
		t.Fatalf("row %s/%s %q confirmed=%v; want %s/%s %q... confirmed=%v", ti.State, ti.LastFailureKind, ti.ErrorMessage,
			!ti.InfraConfirmedAt.IsZero(), state, kind, msgPrefix, confirmed)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}

	t.Run("Settle", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name   string
			phase  corev1.PodPhase
			status func(t *testing.T) func(*corev1.PodStatus)
			state  string
			kind   string
			msg    string
			conf   bool
			// sensor, when set, declares the task a sensor whose try's
			// first poke was that long ago.
			sensor time.Duration
			// label is the decision the sweep records (default
			// reconcile_settled).
			label string
		}{
			{name: "DurableSuccessRecordSettlesSuccess", phase: corev1.PodFailed, state: sdk.StateSuccess,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))
				}},
			{name: "RescheduleRecordOfASensorParksTheTask", phase: corev1.PodSucceeded, state: sdk.StateUpForReschedule,
				sensor: time.Minute, status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordReschedule, code(0), ""))
				}},
			// The task can write its own termination message: a RESCHEDULE
			// record of a task that is not a sensor buys no new epoch.
			{name: "ForgedRescheduleRecordOfANonSensorIsATaskFailureWithTheReason", phase: corev1.PodSucceeded,
				state: sdk.StateFailed, kind: sdk.FailureTask, msg: sdk.LabelRescheduleNotSensor + ":",
				label: sdk.LabelRescheduleNotSensor, status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordReschedule, code(0), ""))
				}},
			{name: "RescheduleRecordPastTheSensorTimeoutFromTheFirstPokeIsATaskFailure", phase: corev1.PodSucceeded,
				state: sdk.StateFailed, kind: sdk.FailureTask, msg: sdk.LabelSensorTimeout + ":", sensor: 2 * time.Hour,
				label: sdk.LabelSensorTimeout, status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordReschedule, code(0), ""))
				}},
			{name: "RecordOfAnotherEpochIsNoRecord", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureTask,
				msg: "task_failed: pod failed", status: func(t *testing.T) func(*corev1.PodStatus) {
					other := a
					other.Epoch = 0
					return finish(corev1.PodFailed, 1, "Error", rec(t, other, RecordSuccess, code(0), ""))
				}},
			{name: "FailedRecordIsATaskFailureInItsWords", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureTask,
				msg: "task_failed: exit status 3", status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodFailed, 3, "Error", rec(t, a, RecordFailed, code(3), "exit status 3"))
				}},
			{name: "DisruptionConditionIsInfraConfirmedAtOnce", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureInfra,
				msg: "pod_disrupted: DisruptionTarget DeletionByTaintManager", conf: true,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 137, "Error", ""), disruptedBy("DeletionByTaintManager"))
				}},
			{name: "NodePressureEvictionIsInfra", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureInfra,
				msg: "pod_disrupted: Evicted: The node was low on resource: memory.", conf: true,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 137, "Error", ""), func(st *corev1.PodStatus) {
						st.Reason, st.Message = "Evicted", "The node was low on resource: memory. "
					})
				}},
			{name: "DisruptionFailedRecordDoesNotWin", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureInfra,
				msg: "pod_disrupted: NodeShutdown", conf: true, status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 143, "Error", rec(t, a, RecordFailed, code(143), "SIGTERM")),
						func(st *corev1.PodStatus) { st.Reason = "NodeShutdown" })
				}},
			{name: "DisruptionSuccessRecordWins", phase: corev1.PodFailed, state: sdk.StateSuccess,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")), disruptedBy("TerminationByKubelet"))
				}},
			{name: "DisruptionOOMKilledStaysTaskFailure", phase: corev1.PodFailed, state: sdk.StateFailed, kind: sdk.FailureTask,
				msg: "oom_killed:", status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 137, "OOMKilled", ""), disruptedBy("TerminationByKubelet"))
				}},
			{name: "DisruptionOwnLimitEvictionStaysTaskFailureQuotingTheKubelet", phase: corev1.PodFailed, state: sdk.StateFailed,
				kind: sdk.FailureTask, msg: `evicted_own_limit: Container task exceeded its local ephemeral storage limit "1Gi".`,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return both(finish(corev1.PodFailed, 137, "Error", ""), func(st *corev1.PodStatus) {
						st.Reason, st.Message = "Evicted", `Container task exceeded its local ephemeral storage limit "1Gi". `
					})
				}},
			{name: "ControlPlaneUnavailableRecordIsInfraConfirmedAtOnce", phase: corev1.PodFailed, state: sdk.StateFailed,
				kind: sdk.FailureInfra, msg: "control_plane_unavailable: Unavailable: GetTaskSpec", conf: true,
				status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodFailed, 1, "Error", rec(t, a, RecordInfra, nil, "Unavailable: GetTaskSpec"))
				}},
			{name: "ControlPlaneMarkerWithAnExitCodeStaysTaskFailure", phase: corev1.PodFailed, state: sdk.StateFailed,
				kind: sdk.FailureTask, msg: "task_failed:", status: func(t *testing.T) func(*corev1.PodStatus) {
					return finish(corev1.PodFailed, 1, "Error", rec(t, a, RecordInfra, code(1), "Unavailable"))
				}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				s := newSweepEnv(t)
				s.runningOnBoard(a)
				if c.sensor > 0 {
					s.sensor(a, time.Hour, time.Now().Add(-c.sensor))
				}
				s.finished(a, c.phase, c.status(t))
				res := s.sweep(time.Now())
				wantRow(t, s.row(a), c.state, c.kind, c.msg, c.conf)
				label := c.label
				if label == "" {
					label = sdk.LabelReconcileSettled
				}
				if len(res.Decisions) != 1 || res.Decisions[0].Label != label || !res.Decisions[0].Applied ||
					res.Decisions[0].Attempt != a {
					t.Fatalf("decisions %+v, want one applied %s", res.Decisions, label)
				}
			})
		}
	})

	t.Run("SettleOnlyTheAttemptItsLabelsName", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		newer := a
		newer.Epoch = 2
		s.runningOnBoard(newer)
		s.finished(a, corev1.PodSucceeded, finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		s.sweep(time.Now())
		if ti := s.row(newer); ti.State != sdk.StateRunning {
			t.Fatalf("a superseded pod's SUCCESS settled its replacement: %s", ti.State)
		}
	})

	// A task that ran again leaves a finished pod per attempt; the board
	// takes a task instance once a batch, so the sweep must not name it
	// twice in one (it used to, and then every sweep failed until the old
	// pods went: nothing settled, confirmed or collected).
	t.Run("TwoFinishedPodsOfOneTaskInstanceSettleInOneSweep", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		retry := a
		retry.Try = 2
		s.runningOnBoard(retry)
		s.finished(a, corev1.PodFailed, finish(corev1.PodFailed, 3, "Error", rec(t, a, RecordFailed, code(3), "exit status 3")))
		s.finished(retry, corev1.PodFailed, both(finish(corev1.PodFailed, 137, "Error", ""), disruptedBy("EvictionByEvictionAPI")))
		s.sweep(time.Now())
		wantRow(t, s.row(retry), sdk.StateFailed, sdk.FailureInfra, "pod_disrupted: DisruptionTarget EvictionByEvictionAPI", true)
	})

	t.Run("UnknownIsNotTerminal", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(a)
		p := s.finished(a, corev1.PodUnknown, finish(corev1.PodUnknown, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		s.sweep(time.Now().Add(time.Hour))
		if ti := s.row(a); ti.State != sdk.StateRunning {
			t.Fatalf("an Unknown pod settled its attempt: %s", ti.State)
		}
		if s.get(p.Name) == nil {
			t.Fatal("an Unknown pod was collected")
		}
	})

	t.Run("Confirm", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name    string
			pod     func(s *sweepEnv)
			confirm bool
		}{
			{name: "NoPodLeftConfirms", confirm: true, pod: func(*sweepEnv) {}},
			{name: "TaskContainerTerminatedWithoutSuccessConfirms", confirm: true, pod: func(s *sweepEnv) {
				s.finished(a, corev1.PodFailed, finish(corev1.PodFailed, 137, "Error", rec(t, a, RecordFailed, code(137), "killed")))
			}},
			{name: "ContainerStillRunningHoldsTheMark", pod: func(s *sweepEnv) { s.running(a) }},
			{name: "StoppedInPlaceReadingFailedWhileItsContainerRunsHolds", pod: func(s *sweepEnv) {
				p := s.running(a)
				// The kubelet's part: the deadline passed, the pod reads
				// Failed, the container is still inside its grace.
				s.playStatus(p.Name, func(st *corev1.PodStatus) { st.Phase, st.Reason = corev1.PodFailed, "DeadlineExceeded" })
			}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				s := newSweepEnv(t)
				s.runningOnBoard(a)
				now := time.Now()
				s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
				c.pod(s)
				res := s.sweep(now)
				ti := s.row(a)
				if confirmed := !ti.InfraConfirmedAt.IsZero(); confirmed != c.confirm {
					t.Fatalf("confirmed = %v, want %v (decisions %+v)", confirmed, c.confirm, res.Decisions)
				}
				wantRow(t, ti, sdk.StateFailed, sdk.FailureInfra, "agent_lost:", c.confirm)
			})
		}
	})

	t.Run("Override", func(t *testing.T) {
		t.Parallel()
		success := func(t *testing.T, s *sweepEnv) {
			s.finished(a, corev1.PodFailed, finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), "")))
		}
		t.Run("DurableSuccessInsideTheValveWins", func(t *testing.T) {
			t.Parallel()
			s := newSweepEnv(t)
			s.runningOnBoard(a)
			now := time.Now()
			s.mark(a, sdk.LabelPodLost, now.Add(-time.Minute))
			// The task ended 90 s ago, before the mark (its report was lost).
			ended := now.Add(-90 * time.Second).Truncate(time.Second)
			s.finished(a, corev1.PodFailed, func(st *corev1.PodStatus) {
				finish(corev1.PodFailed, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))(st)
				st.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.NewTime(ended)
			})
			res := s.sweep(now)
			ti := s.row(a)
			if ti.State != sdk.StateSuccess || ti.LastFailureKind != "" || ti.ErrorMessage != "" {
				t.Fatalf("row %s/%s %q, want success with no infra kind", ti.State, ti.LastFailureKind, ti.ErrorMessage)
			}
			// Measured to its real end, not to the sweep (reaperctl tune).
			if !ti.EndedAt.Equal(ended) {
				t.Fatalf("ended_at %s, want the container's end %s", ti.EndedAt, ended)
			}
			if !slices.Contains(s.log(a), "outcome recovered from the durable record over pod_lost") {
				t.Fatalf("attempt log %q lacks the override line", s.log(a))
			}
			if res.Overrides[sdk.LabelPodLost] != 1 {
				t.Fatalf("overrides %v, want pod_lost: 1", res.Overrides)
			}
		})
		held := []struct {
			name                   string
			setup                  func(t *testing.T, s *sweepEnv, now time.Time)
			confirmed, provisional bool
		}{
			{name: "FailedRecordNeverOverrides", confirmed: true, setup: func(t *testing.T, s *sweepEnv, now time.Time) {
				s.mark(a, sdk.LabelAgentLost, now.Add(-time.Minute))
				s.finished(a, corev1.PodFailed, finish(corev1.PodFailed, 143, "Error", rec(t, a, RecordFailed, code(143), "SIGTERM")))
			}},
			{name: "RecordAfterTheValveIgnored", provisional: true, setup: func(t *testing.T, s *sweepEnv, now time.Time) {
				s.mark(a, sdk.LabelAgentLost, now.Add(-ladder.Defaults().InfraConfirmValve-time.Second))
				success(t, s)
			}},
			{name: "RecordAfterTheRunFinalizedIgnored", setup: func(t *testing.T, s *sweepEnv, now time.Time) {
				s.mark(a, sdk.LabelAgentLost, now.Add(-time.Minute))
				if ok, err := s.w.FinishRun(context.Background(), a.RunID, sdk.RunFailed, "failed", now.Add(-time.Second)); err != nil || !ok {
					t.Fatalf("finishing the run: %v, %v", ok, err)
				}
				success(t, s)
			}},
			{name: "RecordAfterConfirmationIgnored", confirmed: true, setup: func(t *testing.T, s *sweepEnv, now time.Time) {
				s.mark(a, sdk.LabelAgentLost, now.Add(-time.Minute))
				s.sweep(now.Add(-30 * time.Second)) // no pod yet: confirmed
				success(t, s)
			}},
			{name: "UserMarkedFailedNotOverridden", setup: func(t *testing.T, s *sweepEnv, now time.Time) {
				s.mark(a, sdk.LabelAgentLost, now.Add(-time.Minute))
				// A user's mark-state action: a task failure, the infra kind
				// cleared.
				if ok, err := s.w.Fail(context.Background(), a, []string{sdk.StateFailed},
					lifecycle.Failure{Kind: sdk.MarkTask, Reason: "marked_failed", Message: "marked_failed: by a user"},
					now.Add(-time.Second)); err != nil || !ok {
					t.Fatalf("the user's mark: %v, %v", ok, err)
				}
				success(t, s)
			}},
		}
		for _, h := range held {
			t.Run(h.name, func(t *testing.T) {
				t.Parallel()
				s := newSweepEnv(t)
				s.runningOnBoard(a)
				now := time.Now()
				h.setup(t, s, now)
				res := s.sweep(now)
				ti := s.row(a)
				if ti.State == sdk.StateSuccess || len(res.Overrides) != 0 {
					t.Fatalf("overridden: row %s, overrides %v", ti.State, res.Overrides)
				}
				if slices.Contains(s.log(a), "outcome recovered from the durable record over agent_lost") {
					t.Fatalf("attempt log %q has an override line", s.log(a))
				}
				if h.confirmed && ti.InfraConfirmedAt.IsZero() {
					t.Fatalf("row %+v, want the mark confirmed", ti)
				}
				if h.provisional && (ti.LastFailureKind != sdk.FailureInfra || !ti.InfraConfirmedAt.IsZero()) {
					t.Fatalf("row %+v, want the mark still provisional", ti)
				}
			})
		}
	})

	t.Run("Collect", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		done, young := a, sdk.Attempt{RunID: "run-1", TaskID: "young", Try: 1, Epoch: 1}
		s.runningOnBoard(done)
		s.runningOnBoard(young)
		old := s.finished(done, corev1.PodSucceeded, finish(corev1.PodSucceeded, 0, "Completed", rec(t, done, RecordSuccess, code(0), "")))
		fresh := s.finished(young, corev1.PodSucceeded, func(st *corev1.PodStatus) {
			finish(corev1.PodSucceeded, 0, "Completed", rec(t, young, RecordSuccess, code(0), ""))(st)
			st.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.NewTime(time.Now().Add(5 * time.Minute))
		})
		s.sweep(time.Now().Add(CollectAfter + time.Second))
		s.waitPod(old.Name, "collected", func(p *corev1.Pod) bool { return p == nil })
		if s.get(fresh.Name) == nil {
			t.Fatal("a pod finished less than ten minutes ago was collected")
		}
	})

	t.Run("WaitsForTheCache", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		bob, _, _ := s.substrateAs(kubetest.Bob, nil) // may not list: never syncs
		if _, err := bob.Sweep(context.Background(), sdk.SweepRequest{Now: time.Now(), Term: s.term, Ladder: ladder.Defaults()}, s.store); err == nil {
			t.Fatal("a sweep on an unsynced cache completed")
		}
	})
}

// recordPod records pod p as attempt a's own, as the kube runner does once
// its create answered.
func (s *sweepEnv) recordPod(a sdk.Attempt, p *corev1.Pod) {
	s.t.Helper()
	if ok, err := s.w.RecordPod(context.Background(), a, string(p.UID), time.Time{}, time.Now()); err != nil || !ok {
		s.t.Fatalf("recording the pod of %s: %v, %v", a, ok, err)
	}
}

// Load_A and load-a share the task-id label load-a. A pod without the raw
// task id annotation is tied to its attempt by the UID the runner recorded,
// never by that label: its outcome settles exactly the task that recorded
// it, and a pod nobody recorded settles nothing.
func TestSweepLossyTaskID(t *testing.T) {
	t.Parallel()
	upper := sdk.Attempt{RunID: "run-lossy", TaskID: "Load_A", Try: 1, Epoch: 1}
	lower := sdk.Attempt{RunID: "run-lossy", TaskID: "load-a", Try: 1, Epoch: 1}
	succeeded := func(t *testing.T, a sdk.Attempt) func(*corev1.PodStatus) {
		return finish(corev1.PodSucceeded, 0, "Completed", rec(t, a, RecordSuccess, code(0), ""))
	}
	// finishedLossy runs an annotation-less pod of a and plays it ending
	// with a's SUCCESS record; record says whether a records the pod.
	finishedLossy := func(t *testing.T, s *sweepEnv, a sdk.Attempt, record bool) *corev1.Pod {
		p := s.running(a, withoutAnnotation())
		if record {
			s.recordPod(a, p)
		}
		p = s.playStatus(p.Name, func(st *corev1.PodStatus) { succeeded(t, a)(st) })
		s.cachedPhase(s.sub, a, p.Name, corev1.PodSucceeded)
		return p
	}

	t.Run("SettlesTheTaskThatRecordedThePodNotTheLabelsSibling", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(upper)
		s.runningOnBoard(lower)
		s.recordPod(lower, s.running(lower)) // load-a runs on, in a pod of its own
		p := finishedLossy(t, s, upper, true)
		res := s.sweep(time.Now())
		if ti := s.row(upper); ti.State != sdk.StateSuccess {
			t.Fatalf("Load_A after its own SUCCESS record: %s (decisions %+v)", ti.State, res.Decisions)
		}
		if ti := s.row(lower); ti.State != sdk.StateRunning || ti.LastFailureKind != "" {
			t.Fatalf("load-a was settled by Load_A's record: %s/%s", ti.State, ti.LastFailureKind)
		}
		var got []sdk.Decision
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileSettled {
				got = append(got, d)
			}
		}
		if len(got) != 1 || !got[0].Applied || got[0].Attempt != upper || got[0].Evidence["pod_uid"] != string(p.UID) {
			t.Fatalf("settle decisions %+v, want one applied for %s naming pod %s", got, upper, p.UID)
		}
	})

	t.Run("APodNoTaskRecordedSettlesNothing", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(upper)
		s.runningOnBoard(lower)
		finishedLossy(t, s, upper, false)
		res := s.sweep(time.Now())
		for _, a := range []sdk.Attempt{upper, lower} {
			if ti := s.row(a); ti.State != sdk.StateRunning {
				t.Fatalf("%s was settled by a pod no task recorded: %s", a.TaskID, ti.State)
			}
		}
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileSettled && d.Applied {
				t.Fatalf("an unrecorded pod settled: %+v", d)
			}
		}
	})

	// The same holds for a provisional mark: a sibling's pod that only the
	// lossy label ties to the marked task never overrides the mark with
	// the sibling's success; the task's own recorded pod does.
	t.Run("OverrideOnlyFromThePodTheMarkedTaskRecorded", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(upper)
		s.runningOnBoard(lower)
		now := time.Now()
		s.mark(lower, sdk.LabelAgentLost, now.Add(-30*time.Second))
		s.recordPod(upper, s.running(upper)) // Load_A's own pod, annotated
		// Load_A's old-style pod: labelled load-a, try 1, epoch 1, with a
		// SUCCESS record of load-a's attempt (a record is the task's own
		// words: anything may be in it).
		p := s.running(lower, withoutAnnotation())
		s.playStatus(p.Name, func(st *corev1.PodStatus) { succeeded(t, lower)(st) })
		s.cachedPhase(s.sub, lower, p.Name, corev1.PodSucceeded)
		res := s.sweep(now)
		ti := s.row(lower)
		if ti.State == sdk.StateSuccess || len(res.Overrides) != 0 {
			t.Fatalf("a pod load-a never recorded overrode its mark: row %s, overrides %v", ti.State, res.Overrides)
		}
		if ti.LastFailureKind != sdk.FailureInfra {
			t.Fatalf("row %+v, want the mark kept", ti)
		}
		// The refusal is a decision of its own: metered and audited.
		refused := 0
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileInfraOverride && !d.Applied && d.Evidence["noop"] == sdk.NoopPodNotRecorded {
				refused++
			}
		}
		if refused != 1 {
			t.Fatalf("decisions %+v: want one refused override (pod_not_recorded)", res.Decisions)
		}
	})

	// A provisional mark keeps its attempt's pods from collection; a pod
	// without the exact task id is kept by the mark of any task its label
	// could name (Load_A's mark keeps a pod labelled load-a).
	t.Run("AMarkKeepsTheLossyPodsItsLabelCouldName", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(upper)
		p := s.running(upper, withoutAnnotation())
		s.recordPod(upper, p)
		now := time.Now().Add(CollectAfter + time.Minute)
		s.mark(upper, sdk.LabelAgentLost, now.Add(-30*time.Second))
		s.playStatus(p.Name, func(st *corev1.PodStatus) { finish(corev1.PodFailed, 137, "Error", "")(st) })
		s.cachedPhase(s.sub, upper, p.Name, corev1.PodFailed)
		s.sweep(now)
		if s.get(p.Name) == nil {
			t.Fatal("the pod of a provisional mark was collected")
		}
	})

	t.Run("OverrideFromTheLossyPodTheMarkedTaskRecorded", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.runningOnBoard(upper)
		s.runningOnBoard(lower)
		p := s.running(upper, withoutAnnotation())
		s.recordPod(upper, p)
		now := time.Now()
		s.mark(upper, sdk.LabelAgentLost, now.Add(-30*time.Second))
		s.playStatus(p.Name, func(st *corev1.PodStatus) { succeeded(t, upper)(st) })
		s.cachedPhase(s.sub, upper, p.Name, corev1.PodSucceeded)
		res := s.sweep(now)
		if ti := s.row(upper); ti.State != sdk.StateSuccess || res.Overrides[sdk.LabelAgentLost] != 1 {
			t.Fatalf("Load_A's own recorded pod did not override its mark: row %s, overrides %v", ti.State, res.Overrides)
		}
		if ti := s.row(lower); ti.State != sdk.StateRunning {
			t.Fatalf("load-a moved: %s", ti.State)
		}
	})
}

// warmRunningOnBoard drives warm attempt a to running on the board, bound
// to worker.
func (s *sweepEnv) warmRunningOnBoard(a sdk.Attempt, worker string) {
	s.t.Helper()
	ctx, now := context.Background(), s.scheduled(a, sdk.ExecutorWarm)
	if ok, err := s.w.Enqueue(ctx, a, now); err != nil || !ok {
		s.t.Fatalf("scheduling %s: %v, %v", a, ok, err)
	}
	if ok, err := s.w.QueueWarm(ctx, a, worker, now); err != nil || !ok {
		s.t.Fatalf("binding %s to %s: %v, %v", a, worker, ok, err)
	}
	if stop, err := s.w.Running(ctx, a, now); err != nil || stop {
		s.t.Fatalf("driving %s to running: %v, %v", a, stop, err)
	}
}

// warmWorker makes a warm pool pod named name on the KWOK node and waits
// until it runs.
func (s *sweepEnv) warmWorker(name string) *corev1.Pod {
	s.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelWarmPool: "default"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeName: s.node,
			Containers: []corev1.Container{{Name: "worker", Image: "agent"}}},
	}
	if _, err := s.cs.CoreV1().Pods(s.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("creating warm worker %s: %v", name, err)
	}
	return s.waitPod(name, "Running", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning })
}

// claimAs makes warm worker worker claim through a real attempt API over
// the board, presenting a worker token issued at issued (the claim's time
// on the board), saying it runs running (none: an empty list).
func (s *sweepEnv) claimAs(worker string, issued time.Time, running ...sdk.Attempt) {
	s.t.Helper()
	api := attemptapitest.Start(s.t, s.w, attemptapitest.Options{})
	cred, err := api.Issuer.MintWorker(worker, issued)
	if err != nil {
		s.t.Fatal(err)
	}
	c, err := attemptapi.NewClient(api.URL, cred.Token, api.CA)
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Claim(context.Background(), worker, 1, running); err != nil {
		s.t.Fatalf("claiming as %s: %v", worker, err)
	}
}

// A warm attempt has no pod and leaves no record: its provisional mark
// (agent_lost) is confirmed by the sweep from the warm pool's own signal,
// a live read showing its worker gone or ended, so the planner re-places
// it without waiting for the confirmation valve (whose
// infra_confirm_valve_open is the "reconciler broken" alert). A worker that
// still runs holds the mark; a LIST that fails confirms nothing.
func TestSweepWarmMarks(t *testing.T) {
	t.Parallel()
	a := sdk.Attempt{RunID: "run-warm", TaskID: "load", Try: 1, Epoch: 1}
	const worker = "reaper-warm-default-a"
	confirmed := func(res sdk.SweepResult) bool {
		for _, d := range res.Decisions {
			if d.Label == sdk.LabelReconcileInfraConfirmed && d.Applied && d.Attempt == a &&
				d.Evidence["warm_worker"] == worker {
				return true
			}
		}
		return false
	}
	t.Run("WorkerPodGone_ConfirmedBySweep", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.warmRunningOnBoard(a, worker)
		s.warmWorker(worker)
		now := time.Now()
		s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
		if err := s.cs.CoreV1().Pods(s.ns).Delete(context.Background(), worker, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		s.waitPod(worker, "gone", func(p *corev1.Pod) bool { return p == nil })
		res := s.sweep(now)
		ti := s.row(a)
		if !confirmed(res) || ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("warm mark not confirmed: row %+v, decisions %+v", ti, res.Decisions)
		}
		wantRow(t, ti, sdk.StateFailed, sdk.FailureInfra, "agent_lost:", true)
	})
	t.Run("WorkerContainerTerminated_ConfirmedBySweep", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.warmRunningOnBoard(a, worker)
		s.warmWorker(worker)
		now := time.Now()
		s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
		s.playStatus(worker, func(st *corev1.PodStatus) {
			n := metav1.Now()
			st.Phase = corev1.PodFailed
			st.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: "agent",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error",
					StartedAt: n, FinishedAt: n}}}}
		})
		res := s.sweep(now)
		if ti := s.row(a); !confirmed(res) || ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("warm mark not confirmed: row %+v, decisions %+v", ti, res.Decisions)
		}
	})
	t.Run("WorkerStillRunning_StaysProvisional", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.warmRunningOnBoard(a, worker)
		s.warmWorker(worker)
		now := time.Now()
		s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second))
		res := s.sweep(now)
		if ti := s.row(a); confirmed(res) || !ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("a mark whose worker still runs was confirmed: row %+v", ti)
		}
		wantRow(t, s.row(a), sdk.StateFailed, sdk.FailureInfra, "agent_lost:", false)
	})
	// A live worker's claim: the sweep confirms from the worker's own word
	// once a claim after the mark leaves the attempt out, long before the
	// infra confirmation valve (the mark is 30s old); any other claim
	// leaves the mark for the valve.
	claimCase := func(t *testing.T, issued time.Duration, running ...sdk.Attempt) (sdk.SweepResult, board.TaskInstance, time.Time) {
		t.Helper()
		s := newSweepEnv(t)
		s.warmRunningOnBoard(a, worker)
		s.warmWorker(worker)
		now := time.Now()
		marked := now.Add(-30 * time.Second)
		s.mark(a, sdk.LabelAgentLost, marked)
		s.claimAs(worker, marked.Add(issued), running...)
		res := s.sweep(now)
		return res, s.row(a), marked.Add(issued)
	}
	t.Run("AliveWorkerWhoseClaimAfterTheMarkNoLongerListsTheAttempt_ConfirmedWithoutTheValve", func(t *testing.T) {
		t.Parallel()
		res, ti, claimed := claimCase(t, 20*time.Second) // runs nothing
		if !confirmed(res) || ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("warm mark not confirmed: row %+v, decisions %+v", ti, res.Decisions)
		}
		wantRow(t, ti, sdk.StateFailed, sdk.FailureInfra, "agent_lost:", true)
		for _, d := range res.Decisions {
			if d.Label != sdk.LabelReconcileInfraConfirmed || d.Attempt != a {
				continue
			}
			if d.Evidence["warm_signal"] != string(warmWorkerClaim) ||
				d.Evidence["warm_claimed_at"] != claimed.UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano) ||
				!strings.Contains(d.Detail, worker) {
				t.Fatalf("decision %+v: want the worker and its claim's time as the evidence", d)
			}
		}
	})
	t.Run("AliveWorkerWhoseClaimStillListsTheAttempt_StaysProvisional", func(t *testing.T) {
		t.Parallel()
		res, ti, _ := claimCase(t, 20*time.Second, a)
		if confirmed(res) || !ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("a mark whose worker claims it still runs the attempt was confirmed: row %+v", ti)
		}
		wantRow(t, ti, sdk.StateFailed, sdk.FailureInfra, "agent_lost:", false)
	})
	t.Run("AliveWorkerWhoseClaimIsOlderThanTheMark_StaysProvisional", func(t *testing.T) {
		t.Parallel()
		res, ti, _ := claimCase(t, -10*time.Second) // runs nothing, said before the mark
		if confirmed(res) || !ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("a claim older than the mark confirmed it: row %+v", ti)
		}
		wantRow(t, ti, sdk.StateFailed, sdk.FailureInfra, "agent_lost:", false)
	})
	t.Run("AliveWorkerWhoseClaimListsTheAttemptsOtherEpoch_ConfirmedBySweep", func(t *testing.T) {
		t.Parallel()
		other := a
		other.Epoch++
		if res, ti, _ := claimCase(t, 20*time.Second, other); !confirmed(res) || ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("warm mark not confirmed: row %+v, decisions %+v", ti, res.Decisions)
		}
	})
	t.Run("ListError_ConfirmsNothing", func(t *testing.T) {
		t.Parallel()
		s := newSweepEnv(t)
		s.warmRunningOnBoard(a, worker)
		now := time.Now()
		s.mark(a, sdk.LabelAgentLost, now.Add(-30*time.Second)) // no worker pod at all
		s.synced(s.sub)
		warmSel := "labelSelector=" + url.QueryEscape(WarmPoolSelectorDefault)
		s.calls.mu.Lock()
		s.calls.fail = func(req *http.Request) error {
			if strings.Contains(req.URL.RawQuery, warmSel) {
				return errors.New("the API server is unreachable")
			}
			return nil
		}
		s.calls.mu.Unlock()
		res := s.sweep(now)
		if ti := s.row(a); confirmed(res) || !ti.InfraConfirmedAt.IsZero() {
			t.Fatalf("a warm mark was confirmed on a failed LIST: row %+v", ti)
		}
		var listErr bool
		for _, d := range res.Decisions {
			listErr = listErr || (d.Label == sdk.LabelWarmWorkerListErr && !d.Applied && strings.Contains(d.Detail, "unreachable"))
		}
		if !listErr {
			t.Fatalf("decisions %+v, want %s", res.Decisions, sdk.LabelWarmWorkerListErr)
		}
		// The LIST answers again: the next sweep confirms.
		s.calls.mu.Lock()
		s.calls.fail = nil
		s.calls.mu.Unlock()
		if res := s.sweep(now.Add(30 * time.Second)); !confirmed(res) {
			t.Fatalf("decisions %+v after the LIST recovered", res.Decisions)
		}
	})
}
