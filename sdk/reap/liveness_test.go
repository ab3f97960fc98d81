package reap

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// scriptedLiveness answers a liveness read with answer.
type scriptedLiveness struct {
	sdk.Executions
	answer func(sdk.LivenessRequest) ([]sdk.AttemptLiveness, error)
}

func (s scriptedLiveness) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	return s.answer(req)
}

// ReadLivenessEach puts the answer about attempts[i] at i whatever order
// the substrate answered in; an attempt it did not answer about, or a
// failed read, is an error answer, and the map of ReadLivenessRecorded
// holds the same answers.
func TestReadLivenessEachAnswersInTheAttemptsOrder(t *testing.T) {
	t.Parallel()
	as := []sdk.Attempt{{RunID: "a", TaskID: "t", Try: 1}, {RunID: "b", TaskID: "t", Try: 1}, {RunID: "c", TaskID: "t", Try: 1}}
	alive := func(a sdk.Attempt) sdk.AttemptLiveness {
		return sdk.AttemptLiveness{Attempt: a, State: sdk.Alive, Detail: a.RunID}
	}
	for name, tc := range map[string]struct {
		got  []sdk.AttemptLiveness
		err  error
		want []string // each attempt's detail, or "error"
	}{
		"in order":         {got: []sdk.AttemptLiveness{alive(as[0]), alive(as[1]), alive(as[2])}, want: []string{"a", "b", "c"}},
		"reversed":         {got: []sdk.AttemptLiveness{alive(as[2]), alive(as[1]), alive(as[0])}, want: []string{"a", "b", "c"}},
		"one missing":      {got: []sdk.AttemptLiveness{alive(as[2]), alive(as[0])}, want: []string{"a", "error", "c"}},
		"one not asked":    {got: []sdk.AttemptLiveness{alive(as[0]), alive(sdk.Attempt{RunID: "x"}), alive(as[2])}, want: []string{"a", "error", "c"}},
		"the read failed":  {err: errors.New("api down"), want: []string{"error", "error", "error"}},
		"nothing answered": {want: []string{"error", "error", "error"}},
	} {
		exec := scriptedLiveness{answer: func(sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) { return tc.got, tc.err }}
		each := ReadLivenessEach(context.Background(), exec, t0, as, nil, false)
		byMap := ReadLivenessRecorded(context.Background(), exec, t0, as, nil, false)
		var got []string
		for i, ans := range each {
			if ans.Attempt != as[i] {
				t.Fatalf("%s: answer %d is about %v, want %v", name, i, ans.Attempt, as[i])
			}
			if m := byMap[as[i]]; m.Detail != ans.Detail || (m.Err == nil) != (ans.Err == nil) {
				t.Fatalf("%s: the map's answer about %v differs from the slice's", name, as[i])
			}
			d := ans.Detail
			if ans.Err != nil {
				if !ans.Unknown() {
					t.Fatalf("%s: an error answer that is not unknown", name)
				}
				d = "error"
			}
			got = append(got, d)
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("%s: answers %v, want %v", name, got, tc.want)
		}
	}
}
