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

// ControlPlaneUnanswered reports whether err is an answer that never came:
// whether it wraps ErrUnanswered. It is Config.Unanswered's default.
func ControlPlaneUnanswered(err error) bool {
	return errors.Is(err, ErrUnanswered)
}
