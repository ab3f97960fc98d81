package kube

import (
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

func TestEventType(t *testing.T) {
	// A teardown of an attempt follows its mark; a run's (orphan_run) does
	// not.
	a := &sdk.Attempt{RunID: "r1", TaskID: "t", Try: 1}
	for _, c := range []struct {
		req  sdk.TeardownRequest
		warn bool
	}{
		{sdk.TeardownRequest{Attempt: a, Reason: sdk.LabelAgentLost}, true},
		{sdk.TeardownRequest{Attempt: a, Reason: sdk.LabelPodLost}, true},
		{sdk.TeardownRequest{Attempt: a, Reason: sdk.LabelDispatchLost}, true},
		{sdk.TeardownRequest{Attempt: a, Reason: sdk.LabelStartExpired}, true},
		{sdk.TeardownRequest{Attempt: a, Reason: sdk.LabelCredentialCeiling}, true},
		{sdk.TeardownRequest{Attempt: a, Reason: "parked_expired"}, true},
		{sdk.TeardownRequest{RunID: "r1", Reason: sdk.LabelOrphanRun}, false},
		{sdk.TeardownRequest{RunID: "r1"}, false},
	} {
		if got := teardownWarns(c.req); got != c.warn {
			t.Errorf("a teardown for %q (attempt %v) warns: %v, want %v", c.req.Reason, c.req.Attempt != nil, got, c.warn)
		}
	}
	for o, warn := range map[sdk.Outcome]bool{sdk.OutcomeSuccess: false, sdk.OutcomeReschedule: false,
		sdk.OutcomeFailed: true, sdk.OutcomeInfra: true} {
		if got := settleWarns(o); got != warn {
			t.Errorf("a settlement %s warns: %v, want %v", o, got, warn)
		}
	}
}

func TestEventNotes(t *testing.T) {
	a := sdk.Attempt{RunID: "r1", TaskID: "load_a", Try: 2, Epoch: 3}
	if got, want := attemptNote(a), "attempt run r1, task load_a, try 2, epoch 3"; got != want {
		t.Errorf("attemptNote %q, want %q", got, want)
	}
	st := sdk.Settlement{Attempt: a, Outcome: sdk.OutcomeInfra, Reason: sdk.ReasonPodDisrupted}
	if got, want := settleNote(a, st, "DisruptedPodIsInfra"),
		"Settled attempt run r1, task load_a, try 2, epoch 3 as infra (pod_disrupted), by rule DisruptedPodIsInfra"; got != want {
		t.Errorf("settleNote %q, want %q", got, want)
	}
	st = sdk.Settlement{Attempt: a, Outcome: sdk.OutcomeSuccess}
	if got, want := settleNote(a, st, "DurableSuccessRecord"),
		"Settled attempt run r1, task load_a, try 2, epoch 3 as success, by rule DurableSuccessRecord"; got != want {
		t.Errorf("settleNote %q, want %q", got, want)
	}
	// A run's teardown names the attempt the pod's labels name, or only
	// the run when they name none.
	l, ann := AttemptLabels(a)
	if got := podAttemptNote(&pod{labels: labelsOf(l, ann)}); got != attemptNote(a) {
		t.Errorf("podAttemptNote %q", got)
	}
	if got := podAttemptNote(&pod{labels: labelsOf(map[string]string{LabelRunID: "r1"}, nil)}); got != "run r1" {
		t.Errorf("podAttemptNote of a pod naming no attempt %q", got)
	}
}

// TestStreak: each run of failures is told once when it begins and once
// when it ends, with its length; every failure is counted.
func TestStreak(t *testing.T) {
	var s streak
	if n, ended := s.ok(); ended || n != 0 {
		t.Fatalf("ok before any failure: %d, %v", n, ended)
	}
	if !s.fail() || s.fail() || s.fail() {
		t.Fatal("the first failure of a run not told alone")
	}
	if n, ended := s.ok(); !ended || n != 3 {
		t.Fatalf("the run's end: %d, %v; want 3, true", n, ended)
	}
	if _, ended := s.ok(); ended {
		t.Fatal("a run ended twice")
	}
	if !s.fail() {
		t.Fatal("a new run's first failure not told")
	}
	if n, _ := s.ok(); n != 1 || s.count() != 4 {
		t.Fatalf("second run %d, total %d; want 1, 4", n, s.count())
	}
}
