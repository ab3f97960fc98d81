package owed

import (
	"context"
	"errors"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

func TestTeardownOwed(t *testing.T) {
	t.Parallel()
	gone := sdk.TeardownGone + `pods "p" not found`
	for _, c := range []struct {
		name string
		out  []sdk.TeardownOutcome
		err  error
		owed bool
	}{
		{"StoppedInPlace_Complete", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownStoppedInPlace}}, nil, false},
		{"Deleted_Complete", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownDeleted}}, nil, false},
		{"DeleteFallback_Complete", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownDeleteFallback}}, nil, false},
		{"SkippedTerminal_Complete", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownSkipTerminal}}, nil, false},
		{"NothingLeft_Complete", []sdk.TeardownOutcome{{Object: "attempt r/t", Action: sdk.TeardownNothing}}, nil, false},
		{"NoOutcomes_Complete", nil, nil, false},
		{"PodGone_Complete", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownNothing, Error: gone}}, nil, false},
		{"CallFailed_Owed", nil, errors.New("kube teardown of attempt r/t: reading its pods: connection refused"), true},
		{"CallTimedOut_Owed", nil, context.DeadlineExceeded, true},
		{"DeleteForbidden_Owed", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownNothing,
			Error: `deleting pod/ns/p: pods "p" is forbidden`}}, nil, true},
		{"Throttled_Owed", []sdk.TeardownOutcome{{Object: "pod/ns/p", Action: sdk.TeardownNothing,
			Error: "lowering the deadline of pod/ns/p: the server has received too many requests"}}, nil, true},
		{"OneOfTheRunsPodsFailed_Owed", []sdk.TeardownOutcome{
			{Object: "pod/ns/a", Action: sdk.TeardownStoppedInPlace},
			{Object: "pod/ns/b", Action: sdk.TeardownNothing, Error: "deleting pod/ns/b: timeout"},
			{Object: "pod/ns/c", Action: sdk.TeardownNothing, Error: gone}}, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			why, owed := teardownOwed(c.out, c.err)
			if owed != c.owed || owed == (why == "") {
				t.Fatalf("owed %v (%q), want %v", owed, why, c.owed)
			}
		})
	}
}

// declared are the in-tree reapers' declared *_pod_delete_error labels
// (their Info's), and a third party's that declares none.
var declared = map[string][]string{
	"agentlost":    {sdk.LabelAgentLostOrphanStopErr, sdk.LabelAgentLostPodDeleteErr},
	"dispatchlost": {sdk.LabelDispatchLostOrphanStopErr, sdk.LabelDispatchLostPodDeleteErr},
	"podlost":      {sdk.LabelPodLostPodQueryErr, sdk.LabelPodLostPodDeleteErr},
	"orphanrun":    {sdk.LabelOrphanReapNoop, sdk.LabelOrphanRunPodDeleteErr},
	"thirdparty":   {"its_own_mark"},
	"twolabels":    {"a_pod_delete_error", "b_pod_delete_error"},
}

func TestDeleteErrLabel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ reaper, reason, want string }{
		{"agentlost", sdk.LabelAgentLost, sdk.LabelAgentLostPodDeleteErr},
		{"agentlost", sdk.LabelCredentialCeiling, sdk.LabelAgentLostPodDeleteErr},
		{"dispatchlost", sdk.LabelDispatchLost, sdk.LabelDispatchLostPodDeleteErr},
		{"dispatchlost", sdk.LabelStartExpired, sdk.LabelDispatchLostPodDeleteErr},
		{"podlost", sdk.LabelPodLost, sdk.LabelPodLostPodDeleteErr},
		{"orphanrun", sdk.LabelOrphanRun, sdk.LabelOrphanRunPodDeleteErr},
		{"podlost", "", sdk.LabelPodLostPodDeleteErr},
		{"thirdparty", sdk.LabelPodLost, sdk.LabelPodLostPodDeleteErr},
		{"thirdparty", "its_own_mark", sdk.LabelTeardownOwedError},
		{"twolabels", "its_own_mark", sdk.LabelTeardownOwedError},
	} {
		if got := DeleteErrLabel(declared[c.reaper], c.reason); got != c.want {
			t.Errorf("EachReaperItsOwnLabel: %s/%s: %s, want %s", c.reaper, c.reason, got, c.want)
		}
	}
}

// feedExec is executions that serve the change feed.
type feedExec struct {
	sdk.Executions
	sdk.ChangeFeed
}

func TestOwingExecutionsKeepTheChangeFeed(t *testing.T) {
	t.Parallel()
	s := &Service{}
	if _, ok := s.Wrap(feedExec{}, "podlost", 1).(sdk.ChangeFeed); !ok {
		t.Fatal("WithAFeed_TheFeedStaysVisible: the wrapper hid it")
	}
	if _, ok := s.Wrap(struct{ sdk.Executions }{}, "podlost", 1).(sdk.ChangeFeed); ok {
		t.Fatal("WithoutAFeed_NoneInvented")
	}
}
