package reap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Answer is the substrate's reading of one attempt. Err is set when the
// read failed, or gave no answer for the attempt.
type Answer struct {
	sdk.AttemptLiveness
	Err error
	// Live: the answer came from an authoritative read, not a cache.
	Live bool
}

// Unknown reports whether the answer cannot be acted on: an error, an
// unknown state, or no state at all. Unknown always defers.
func (a Answer) Unknown() bool {
	return a.Err != nil || a.State == sdk.Unknown || a.State == ""
}

// Why is the answer in words, for a decision's detail.
func (a Answer) Why() string {
	if a.Err != nil {
		return "liveness query failed: " + a.Err.Error()
	}
	if a.Detail == "" {
		return "liveness " + string(a.State)
	}
	return "liveness " + string(a.State) + ": " + a.Detail
}

// errNoAnswer: the substrate answered the batch but not for this attempt.
var errNoAnswer = errors.New("the substrate gave no answer for this attempt")

// ReadLiveness asks the substrate about a batch of attempts in one call. A
// failed call makes every answer an error, so every attempt defers.
func ReadLiveness(ctx context.Context, exec sdk.Executions, now time.Time, attempts []sdk.Attempt, live bool) map[sdk.Attempt]Answer {
	return ReadLivenessRecorded(ctx, exec, now, attempts, nil, live)
}

// RecordedPodUIDs are the pod UIDs the candidates record (Candidate.PodUID),
// by attempt; nil when none records one.
func RecordedPodUIDs(cs []sdk.Candidate) map[sdk.Attempt]string {
	var out map[sdk.Attempt]string
	for _, c := range cs {
		if c.PodUID == "" {
			continue
		}
		if out == nil {
			out = make(map[sdk.Attempt]string, len(cs))
		}
		out[c.Attempt] = c.PodUID
	}
	return out
}

// ReadLivenessRecorded is ReadLiveness telling the substrate the pod UID
// recorded on each attempt (RecordedPodUIDs), so that only that pod counts
// for the attempt: a pod someone else made with its labels keeps nothing
// alive.
func ReadLivenessRecorded(ctx context.Context, exec sdk.Executions, now time.Time, attempts []sdk.Attempt,
	recorded map[sdk.Attempt]string, live bool) map[sdk.Attempt]Answer {
	each := ReadLivenessEach(ctx, exec, now, attempts, recorded, live)
	out := make(map[sdk.Attempt]Answer, len(attempts))
	for i, a := range attempts {
		out[a] = each[i]
	}
	return out
}

// ReadLivenessEach is ReadLivenessRecorded answering in a slice, the
// answer about attempts[i] at i, rather than a map: for a reaper that
// judges a page in its order, it spares the map (whose values, an answer
// each, the runtime allocates one by one).
func ReadLivenessEach(ctx context.Context, exec sdk.Executions, now time.Time, attempts []sdk.Attempt,
	recorded map[sdk.Attempt]string, live bool) []Answer {
	out := make([]Answer, len(attempts))
	if len(attempts) == 0 {
		return out
	}
	got, err := exec.Liveness(ctx, sdk.LivenessRequest{Attempts: attempts, Live: live, Now: now, PodUIDs: recorded})
	if err != nil {
		err = fmt.Errorf("read liveness of %d attempts: %w", len(attempts), err)
		for i, a := range attempts {
			out[i] = Answer{AttemptLiveness: sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown}, Err: err, Live: live}
		}
		return out
	}
	// A substrate answers in the request's order as a rule; any other
	// order (or an answer missing, or one about an attempt not asked) is
	// matched by attempt, the last answer about an attempt counting.
	inOrder := len(got) == len(attempts)
	for i := 0; inOrder && i < len(got); i++ {
		inOrder = got[i].Attempt == attempts[i]
	}
	if inOrder {
		for i, l := range got {
			out[i] = Answer{AttemptLiveness: l, Live: live}
		}
		return out
	}
	byAttempt := make(map[sdk.Attempt]int, len(got))
	for i, l := range got {
		byAttempt[l.Attempt] = i
	}
	for i, a := range attempts {
		if k, ok := byAttempt[a]; ok {
			out[i] = Answer{AttemptLiveness: got[k], Live: live}
			continue
		}
		out[i] = Answer{AttemptLiveness: sdk.AttemptLiveness{Attempt: a, State: sdk.Unknown}, Err: errNoAnswer, Live: live}
	}
	return out
}
