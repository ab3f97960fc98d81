package board

import (
	"strings"

	"github.com/dexaflow/reaper/sdk"
)

// RescheduleRefusalSQL is sdk.Sensor.RescheduleRefusal in SQL, clause for
// clause: over the task instance aliased ti, at the timestamptz expression
// now, with the credential ceiling in microseconds as the int8 expression
// ceilingMicros (<= 0: none). It is never NULL: ” when the reschedule may
// go ahead.
func RescheduleRefusalSQL(ti, now, ceilingMicros string) string {
	return `(CASE
        -- the task is not a sensor,
        WHEN NOT ` + ti + `.sensor THEN '` + sdk.LabelRescheduleNotSensor + `'
        -- the sensor is at or past its own timeout, counted from its first poke,
        WHEN ` + ti + `.first_poke_at IS NOT NULL
            AND NOT (` + now + ` < ` + ti + `.first_poke_at + ` + ti + `.sensor_timeout_seconds * interval '1 second')
            THEN '` + sdk.LabelSensorTimeout + `'
        -- or at or past the credential ceiling, counted from the try's first dispatch.
        WHEN ` + ceilingMicros + ` > 0 AND ` + ti + `.try_dispatched_at IS NOT NULL
            AND NOT (` + now + ` < ` + ti + `.try_dispatched_at + ` + ceilingMicros + ` * interval '1 microsecond')
            THEN '` + sdk.LabelSensorCredentialCeiling + `'
        ELSE '' END)`
}

// RescheduleMessageSQL is sdk.RescheduleFailure in SQL over the text
// expression refused (a RescheduleRefusalSQL answer; NULL for ”).
func RescheduleMessageSQL(refused string) string {
	var b strings.Builder
	b.WriteString("(CASE " + refused)
	for _, r := range sdk.RescheduleRefusals() {
		b.WriteString(" WHEN " + quote(r) + " THEN " + quote(sdk.RescheduleFailure(r)))
	}
	b.WriteString(" END)")
	return b.String()
}

// RescheduleSpendsRetriesSQL is sdk.RescheduleSpendsRetries in SQL over the
// text expression refused.
func RescheduleSpendsRetriesSQL(refused string) string {
	var reasons []string
	for _, r := range sdk.RescheduleRefusals() {
		if sdk.RescheduleSpendsRetries(r) {
			reasons = append(reasons, quote(r))
		}
	}
	return "(" + refused + " IN (" + strings.Join(reasons, ", ") + "))"
}

// quote is s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
