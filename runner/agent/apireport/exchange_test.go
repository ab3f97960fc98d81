package apireport

import (
	"errors"
	"testing"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
)

// The exchange's classification, call by call: a bootstrap_spent is the
// lost answer only after an exchange of this reporter went unanswered;
// any other refusal after one stays a refusal. The API's answers that the
// pod proof is not decided yet (pod_not_recorded, pod_unverified) are
// retried, but they are answers that nothing applied: a bootstrap_spent
// after them stays a refusal. A refused pod proof (exchange_not_from_pod)
// is a refusal.
func TestAPIReporterExchangeClassification(t *testing.T) {
	spent := &attemptapi.CallError{Status: 403, Body: attemptapi.ErrorBody{Code: attemptapi.CodeBootstrapSpent}}
	other := &attemptapi.CallError{Status: 403, Body: attemptapi.ErrorBody{Code: "forbidden"}}
	reset := transportErr(errors.New("connection reset by peer"))
	notRecorded := &attemptapi.CallError{Status: 503, Body: attemptapi.ErrorBody{Code: attemptapi.CodePodNotRecorded}}
	unverified := &attemptapi.CallError{Status: 503, Body: attemptapi.ErrorBody{Code: attemptapi.CodePodUnverified}}
	notFromPod := &attemptapi.CallError{Status: 403, Body: attemptapi.ErrorBody{Code: attemptapi.CodeNotFromPod}}
	lost := func(err error) bool { return errors.Is(err, agent.ErrAnswerLost) }
	for name, c := range map[string]struct {
		calls []error
		want  func(error) bool
	}{
		"SpentFirst_Refusal":               {[]error{spent}, refusal},
		"SpentAfterUnanswered_Lost":        {[]error{reset, spent}, lost},
		"SpentAfterUnansweredTwice_Lost":   {[]error{reset, callErr(503), spent}, lost},
		"OtherRefusalAfterUnanswered":      {[]error{reset, other}, refusal},
		"PodNotRecordedRetried":            {[]error{notRecorded}, agent.ControlPlaneUnanswered},
		"SpentAfterPodNotRecorded_Refusal": {[]error{notRecorded, unverified, spent}, refusal},
		"NotFromPod_Refusal":               {[]error{reset, notFromPod}, refusal},
		"UnansweredAfterSpent_Unanswered": {[]error{spent, reset},
			func(err error) bool { return agent.ControlPlaneUnanswered(err) && !lost(err) }},
	} {
		t.Run(name, func(t *testing.T) {
			r := &Reporter{}
			var err error
			for _, call := range c.calls {
				err = r.exchangeFailed(call)
			}
			if !c.want(err) {
				t.Fatalf("%v: classified wrong", err)
			}
			if lost(err) && (!agent.ControlPlaneUnanswered(err) || errors.Is(err, agent.ErrRefused)) {
				t.Fatalf("%v: a lost answer must be unanswered and no refusal", err)
			}
			if !errors.Is(err, c.calls[len(c.calls)-1]) {
				t.Fatalf("%v does not wrap the call's error", err)
			}
		})
	}
	if (&Reporter{}).exchangeFailed(nil) != nil {
		t.Fatal("an exchange that succeeded failed")
	}
}

func refusal(err error) bool {
	return errors.Is(err, agent.ErrRefused) && !agent.ControlPlaneUnanswered(err)
}
