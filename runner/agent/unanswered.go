package agent

import "errors"

// ErrUnanswered, wrapped by a Reporter's error, says the control plane never
// answered the call: it was down or unreachable, the call timed out, or the
// answer was a failure of the control plane itself rather than a verdict on
// the call (for the attempt API: a 5xx, a 429, an unreadable answer). It is
// the counterpart of ErrRefused: a refusal, and any error wrapping neither,
// is an answer.
//
// Only the RUNNING report reads it: when every failure of that report wraps
// it for all of StartRetry, the task never starts and Run returns
// ErrStartUnanswered (pod mode then writes the infra marker); a single
// answer among them makes the same give-up a plain start failure.
var ErrUnanswered = errors.New("the control plane did not answer")

// ErrAnswerLost, wrapped by a Reporter's error together with ErrUnanswered,
// says a pre-start call's answer never came and never can: the call applied,
// its answer was lost on the way, and the call cannot be made again (the
// attempt API's exchange of a single-use bootstrap token, whose retry is
// refused as spent). Retrying is pointless, so the agent gives up at once,
// as it would once StartRetry ran out with no answer.
var ErrAnswerLost = errors.New("the control plane applied the call, but its answer was lost")

// ControlPlaneUnanswered reports whether err is an answer that never came:
// whether it wraps ErrUnanswered. It is Config.Unanswered's default.
func ControlPlaneUnanswered(err error) bool {
	return errors.Is(err, ErrUnanswered)
}
