package board

import (
	"errors"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dexaflow/reaper/sdk"
)

// Tenants' text at the board's edge. Every writer of the board that takes
// text a task, an agent, a pod or a plugin chose (reasons, messages, try
// log lines, a decision's detail and evidence, a failed teardown's error)
// passes it through Safe first, with the field's bound: sdk.SafeText is the
// rule (NUL and invalid UTF-8 become U+FFFD, the text is cut on a rune
// boundary with sdk.TextCutMarker past its bound). Clean text costs two
// scans and no allocation (BenchmarkSafeText).

// TextField names a field of tenants' text and carries its bound.
type TextField string

// The fields of tenants' text the board stores.
const (
	FieldReason        TextField = "reason"         // task_instances.failure_reason
	FieldMessage       TextField = "message"        // task_instances.error_message, runs.error_message
	FieldLogLine       TextField = "log_line"       // attempt_log.line
	FieldDetail        TextField = "detail"         // reap_decisions.detail
	FieldEvidenceKey   TextField = "evidence_key"   // a key of reap_decisions' evidence
	FieldEvidenceValue TextField = "evidence_value" // a value of reap_decisions' evidence
	FieldName          TextField = "name"           // the reaper, label, run and task id of a decision
	FieldTeardownError TextField = "teardown_error" // owed_teardowns' last error
)

// Bound is the most bytes the field holds.
func (f TextField) Bound() int {
	switch f {
	case FieldReason:
		return sdk.MaxReasonBytes
	case FieldLogLine:
		return sdk.MaxLogLineBytes
	case FieldDetail:
		return sdk.MaxDetailBytes
	case FieldEvidenceKey:
		return sdk.MaxEvidenceKeyBytes
	case FieldEvidenceValue:
		return sdk.MaxEvidenceValueBytes
	case FieldName:
		return sdk.MaxNameBytes
	case FieldTeardownError:
		return MaxTeardownError
	default:
		return sdk.MaxMessageBytes
	}
}

// Observer hears what the board did to a write it did not refuse whole.
// Its methods are called on the writer's goroutine and must not block.
type Observer interface {
	// TextMadeSafe: a tenant's text for field held a NUL or invalid UTF-8,
	// or was over the field's bound, and was stored made safe.
	TextMadeSafe(field TextField)
	// RowRefused: one request of a batch write (write: "mark", "settle",
	// "append log", "record decisions", ...) failed on its own data when
	// written alone, after its batch had failed; the rest of the batch was
	// applied. a is the request's attempt (zero for an audit row about no
	// task instance).
	RowRefused(write string, a sdk.Attempt, err error)
	// Deposed: a fenced write (write: "mark", "append log", "enqueue",
	// ...) of term was refused by the fence: the board's leader row no
	// longer names term and this replica's holder with an unexpired
	// lease. Told once per refused call, the batch's first refusal for a
	// batch.
	Deposed(write string, term int64)
	// RefusalUnrecorded: a refusal the fence made (told to Deposed) could
	// not be kept in fence_refusals (err says why); the refused call's
	// answer is the refusal all the same. Log it.
	RefusalUnrecorded(write string, term int64, err error)
}

// deposed tells the observer, if any, of a fenced write the fence refused.
func deposed(o Observer, write string, term int64) {
	if o != nil {
		o.Deposed(write, term)
	}
}

// Safe returns v made safe for field (sdk.SafeText with the field's bound),
// telling the store's observer when it had to change it.
func (s *Store) Safe(field TextField, v string) string { return safeText(s.observer, field, v) }

func safeText(obs Observer, field TextField, v string) string {
	bound := field.Bound()
	if sdk.TextIsSafe(v, bound) {
		return v
	}
	if obs != nil {
		obs.TextMadeSafe(field)
	}
	return sdk.SafeText(v, bound)
}

// IsRowError reports whether err is PostgreSQL refusing a statement for
// the data of some row it was given, not for the statement or the
// connection: a data exception (class 22: a value out of range, bad
// encoding, ...), an integrity constraint violated (class 23) or a limit
// exceeded (class 54: a value too large to index). A batch that fails so
// may succeed without the row.
func IsRowError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// safeEach returns reqs with the (up to two) text fields that fields
// points to in each request made safe, the first as kinds[0], the second
// as kinds[1]: reqs itself when all of it is already safe (no allocation),
// else a copy (the caller's slice is never changed).
func safeEach[T any](reqs []T, fields func(*T) [2]*string, obs Observer, kinds ...TextField) []T {
	var out []T
	for i := range reqs {
		for j, p := range fields(&reqs[i]) {
			if p == nil || sdk.TextIsSafe(*p, kinds[j].Bound()) {
				continue
			}
			if out == nil {
				out = slices.Clone(reqs)
			}
			q := fields(&out[i])[j]
			*q = safeText(obs, kinds[j], *q)
		}
	}
	if out == nil {
		return reqs
	}
	return out
}

// safeEvidence returns ev with every key and value made safe: ev itself
// when all of it already is (an empty map for nil), else a copy.
func safeEvidence(obs Observer, ev map[string]string) map[string]string {
	if ev == nil {
		return map[string]string{}
	}
	for k, v := range ev {
		if !sdk.TextIsSafe(k, FieldEvidenceKey.Bound()) || !sdk.TextIsSafe(v, FieldEvidenceValue.Bound()) {
			out := make(map[string]string, len(ev))
			for k, v := range ev {
				out[safeText(obs, FieldEvidenceKey, k)] = safeText(obs, FieldEvidenceValue, v)
			}
			return out
		}
	}
	return ev
}
