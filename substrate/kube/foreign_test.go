package kube

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
)

func foreignPod(i int) *pod {
	return &pod{podMeta: podMeta{Name: fmt.Sprintf("forged-%d", i), Namespace: "ns",
		UID: types.UID(fmt.Sprintf("uid-%d", i))}}
}

// Each foreign pod is reported once, and what is remembered is bounded: past
// maxForeignRemembered the oldest is forgotten (and would be reported again).
func TestForeignPodsAreReportedOnceAndRememberedBoundedly(t *testing.T) {
	f := newForeignPods(hclog.NewNullLogger())
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 1}
	f.saw(foreignPod(0), a, "uid-own", "presence")
	f.saw(foreignPod(0), a, "uid-own", "teardown")
	if ds := f.take(); len(ds) != 1 || ds[0].Label != sdk.LabelForeignTaskPod || ds[0].Evidence["recorded_pod_uid"] != "uid-own" {
		t.Fatalf("decisions %+v, want one foreign_task_pod", ds)
	}
	for i := 1; i <= 2*maxForeignRemembered; i++ {
		f.saw(foreignPod(i), a, "uid-own", "presence")
	}
	if len(f.seen) > maxForeignRemembered || len(f.order) > maxForeignRemembered {
		t.Fatalf("remembered %d/%d, want at most %d", len(f.seen), len(f.order), maxForeignRemembered)
	}
	if ds := f.take(); len(ds) != maxForeignRemembered {
		t.Fatalf("%d pending decisions, want the bound %d", len(ds), maxForeignRemembered)
	}
	f.saw(foreignPod(0), a, "uid-own", "presence") // forgotten long ago
	if ds := f.take(); len(ds) != 1 {
		t.Fatalf("a forgotten pod seen again: %d decisions, want 1", len(ds))
	}
}

// ownPods keeps the recorded pod, or every pod when none is recorded.
func TestOwnPodsKeepsTheRecordedPodOrAllWithoutOne(t *testing.T) {
	r := &running{foreign: newForeignPods(hclog.NewNullLogger())}
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 1}
	pods := []*pod{foreignPod(1), foreignPod(2)}
	if got := r.ownPods(a, "", pods, "presence"); len(got) != 2 {
		t.Fatalf("no recorded UID: kept %d, want both (the label rule)", len(got))
	}
	if got := r.ownPods(a, "uid-2", pods, "presence"); len(got) != 1 || got[0].UID != "uid-2" {
		t.Fatalf("kept %v, want only uid-2", got)
	}
	if got := r.ownPods(a, "uid-9", pods, "presence"); len(got) != 0 {
		t.Fatalf("kept %v, want none", got)
	}
	if ds := r.foreign.take(); len(ds) != 2 {
		t.Fatalf("%d foreign decisions, want 2", len(ds))
	}
}

// A failed sweep's decisions are dropped by the host, so the foreign pods it
// took are queued again for the next sweep.
func TestForeignPodDecisionsOfAFailedSweepArePutBack(t *testing.T) {
	f := newForeignPods(hclog.NewNullLogger())
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 1}
	f.saw(foreignPod(1), a, "uid-own", "presence")
	taken := f.take()
	f.saw(foreignPod(2), a, "uid-own", "teardown")
	f.putBack(taken)
	ds := f.take()
	if len(ds) != 2 || ds[0].Evidence["pod_uid"] != "uid-1" || ds[1].Evidence["pod_uid"] != "uid-2" {
		t.Fatalf("decisions after a failed sweep %+v, want both, the older first", ds)
	}
}
