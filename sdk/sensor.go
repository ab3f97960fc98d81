package sdk

import "time"

// Sensor is what the board keeps of a task's right to reschedule itself:
// whether it was declared a sensor at submit, its own timeout, and the two
// stamps its bounds count from. Zero times stand for NULL.
type Sensor struct {
	// Declared: the task was submitted as a sensor. Only a sensor may end a
	// poke up_for_reschedule.
	Declared bool
	// Timeout is the sensor's own timeout (> 0 for a sensor), counted from
	// FirstPokeAt.
	Timeout time.Duration
	// FirstPokeAt is when the try's first poke reported running; every
	// poke of the try (each a new epoch) keeps it.
	FirstPokeAt time.Time
	// TryDispatchedAt is when the try was first dispatched (queued); the
	// credential ceiling of the sensor's pokes counts from it.
	TryDispatchedAt time.Time
}

// RescheduleRefusal says why an attempt of this task may not end
// up_for_reschedule at now ("" when it may), ceiling being the credential
// ceiling (auth.max_attempt_credential_lifetime; <= 0: none):
//   - LabelRescheduleNotSensor: the task is not a sensor;
//   - LabelSensorTimeout: now is at or past the sensor's timeout, counted
//     from the first poke of the try;
//   - LabelSensorCredentialCeiling: now is at or past the ceiling, counted
//     from the first dispatch of the try.
//
// A refused reschedule is a task failure with that reason. The board's SQL
// (board.RescheduleRefusalSQL) is this rule, clause for clause.
func (s Sensor) RescheduleRefusal(now time.Time, ceiling time.Duration) string {
	switch {
	case !s.Declared:
		return LabelRescheduleNotSensor
	case !s.FirstPokeAt.IsZero() && !now.Before(s.FirstPokeAt.Add(s.Timeout)):
		return LabelSensorTimeout
	case ceiling > 0 && !s.TryDispatchedAt.IsZero() && !now.Before(s.TryDispatchedAt.Add(ceiling)):
		return LabelSensorCredentialCeiling
	}
	return ""
}

// RescheduleFailure is the error message of a reschedule refused for
// reason (a RescheduleRefusal label); it starts with the reason.
func RescheduleFailure(reason string) string {
	switch reason {
	case LabelRescheduleNotSensor:
		return reason + ": the task is not a sensor and may not reschedule itself"
	case LabelSensorTimeout:
		return reason + ": the sensor's pokes went on past its own timeout, counted from its first poke"
	case LabelSensorCredentialCeiling:
		return reason + ": the sensor's pokes went on past the credential ceiling, counted from the first dispatch of its try"
	}
	return reason
}

// RescheduleRefusals lists the labels RescheduleRefusal answers.
func RescheduleRefusals() []string {
	return []string{LabelRescheduleNotSensor, LabelSensorTimeout, LabelSensorCredentialCeiling}
}

// RescheduleSpendsRetries reports whether a reschedule refused for reason
// fails the task for good (its retries spent): a sensor past its own
// timeout does not poke again on a new try.
func RescheduleSpendsRetries(reason string) bool { return reason == LabelSensorTimeout }
