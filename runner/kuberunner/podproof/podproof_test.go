package podproof_test

import (
	"errors"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/kuberunner/podproof"
)

// TestJudge: the decision table of the pod proof, over the
// TokenReview's answer and the recorded pod UID. Only an authenticated
// token for the attempt API's audience, of the task ServiceAccount in the
// task namespace, bound to the very pod the board recorded, proves the
// pod; every other answer is a refusal (ErrNotFromPod) saying why.
func TestJudge(t *testing.T) {
	want := podproof.Expected{Namespace: "tasks", ServiceAccount: "reaper-task", Audience: "reaper-attempt-api", PodUID: "uid-1"}
	good := func() authv1.TokenReviewStatus {
		return authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"reaper-attempt-api"},
			User: authv1.UserInfo{Username: "system:serviceaccount:tasks:reaper-task", Extra: map[string]authv1.ExtraValue{
				"authentication.kubernetes.io/pod-name": {"run-t-1-0-abc"},
				"authentication.kubernetes.io/pod-uid":  {"uid-1"},
			}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*authv1.TokenReviewStatus, *podproof.Expected)
		refuse string // "" accepts; else a word of the refusal
	}{
		{"RecordedPodsTokenProvesIt", func(*authv1.TokenReviewStatus, *podproof.Expected) {}, ""},
		{"NotAuthenticated_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.Authenticated, s.Error = false, "token audiences are invalid"
		}, "does not authenticate"},
		{"AnotherAudience_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.Audiences = []string{"https://kubernetes.default.svc"}
		}, "audiences"},
		{"NoAudience_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) { s.Audiences = nil }, "audiences"},
		{"AnotherServiceAccount_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Username = "system:serviceaccount:tasks:default"
		}, "task ServiceAccount"},
		{"AnotherNamespace_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Username = "system:serviceaccount:elsewhere:reaper-task"
		}, "task ServiceAccount"},
		{"AUserNotAServiceAccount_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Username = "carol"
		}, "task ServiceAccount"},
		{"TokenBoundToNoPod_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Extra = nil
		}, "bound to no pod"},
		{"AnotherPodsToken_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Extra["authentication.kubernetes.io/pod-uid"] = authv1.ExtraValue{"uid-2"}
		}, "records pod uid uid-1"},
		{"TwoPodUIDs_Refused", func(s *authv1.TokenReviewStatus, _ *podproof.Expected) {
			s.User.Extra["authentication.kubernetes.io/pod-uid"] = authv1.ExtraValue{"uid-1", "uid-1"}
		}, "bound to no pod"},
		{"NothingRecorded_Refused", func(_ *authv1.TokenReviewStatus, w *podproof.Expected) { w.PodUID = "" }, "records pod uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, w := good(), want
			tc.change(&st, &w)
			id, err := podproof.Judge(st, w)
			if tc.refuse == "" {
				if err != nil || id.PodUID != "uid-1" || id.PodName != "run-t-1-0-abc" || id.Namespace != "tasks" ||
					id.ServiceAccount != "reaper-task" {
					t.Fatalf("accepted %+v, %v: want the recorded pod proven", id, err)
				}
				return
			}
			if !errors.Is(err, attemptapi.ErrNotFromPod) || !strings.Contains(err.Error(), tc.refuse) {
				t.Fatalf("%v: want a refusal (ErrNotFromPod) saying %q", err, tc.refuse)
			}
		})
	}
}
