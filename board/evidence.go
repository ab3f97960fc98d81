package board

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// A decision's evidence in the audit (migration 014): reap_decisions
// .evidence_packed, a compact binary form the board writes and reads, and
// PostgreSQL stores as it comes (bytea: nothing to parse, nothing to
// validate). Rows written before 014 keep theirs in the jsonb column
// evidence; the board reads either (readEvidence).
//
// The form: the byte evidenceFormat, then each key and value of the map,
// in the map's order. A key is a uvarint: n > 0 is packedKeys[n-1], 0 is
// followed by the key spelled out (a uvarint length and its bytes). A
// value is a uvarint length and its bytes. Strings are kept byte for byte.

// evidenceFormat is the first byte of every packed evidence.
const evidenceFormat = 1

// packedKeys are the evidence keys written as one byte. The list is part of
// the stored form: keys are only ever appended (a test pins it), and a key
// not in it is spelled out, so a reaper's new key needs no change here.
var packedKeys = [...]string{
	"term", "edition", "state", "executor", "threshold", "heartbeat_age", "running_age", "queued_age",
	"pod_uid", "activity_age", "liveness", "agent", "group", "orphan", "pending", "liveness_detail",
	"liveness_live", "signal", "mark", "policy", "noop_reason", "stop", "teardown", "error", "attached",
	"ceiling", "brake_judged", "brake_silence_only", "brake_allowed", "brake_share", "node",
	"node_unreachable_since", "node_error", "confirm", "credential_lapse", "mark_from_states", "mark_kind",
	"mark_reason", "message", "outcome", "parked_for", "warm_workers", "recovered", "refusal", "requests",
	"run_age", "warm_worker", "write", "infra_mark", "hold", "why", "worker", "pod", "attempt",
}

// packedKeyCodes is packedKeys' inverse: a key's code (its index + 1).
func packedKeyCodes() map[string]uint64 {
	m := make(map[string]uint64, len(packedKeys))
	for i, k := range packedKeys {
		m[k] = uint64(i + 1)
	}
	return m
}

// evidencePacker packs evidence with its own copy of the key codes (no
// package state).
type evidencePacker struct{ codes map[string]uint64 }

func newEvidencePacker() evidencePacker { return evidencePacker{codes: packedKeyCodes()} }

// appendPacked appends ev in the packed form, each key and value made safe
// (safeText, told to obs).
func (p evidencePacker) appendPacked(buf []byte, ev map[string]string, obs Observer) []byte {
	buf = append(buf, evidenceFormat)
	for k, v := range ev {
		c, known := p.codes[k]
		if !known { // a known key is the board's own word: safe
			k = safeText(obs, FieldEvidenceKey, k)
		}
		buf = appendEntry(buf, c, k, safeText(obs, FieldEvidenceValue, v))
	}
	return buf
}

// appendPair appends one key and its value, as they are.
func (p evidencePacker) appendPair(buf []byte, k, v string) []byte {
	return appendEntry(buf, p.codes[k], k, v)
}

// appendEntry appends a key (its code c, or spelled out when c is 0) and
// its value.
func appendEntry(buf []byte, c uint64, k, v string) []byte {
	if c != 0 {
		buf = binary.AppendUvarint(buf, c)
	} else {
		buf = append(buf, 0)
		buf = binary.AppendUvarint(buf, uint64(len(k)))
		buf = append(buf, k...)
	}
	buf = binary.AppendUvarint(buf, uint64(len(v)))
	return append(buf, v...)
}

var errPackedTruncated = errors.New("packed evidence cut short")

// unpackEvidence reads evidence in the packed form.
func unpackEvidence(b []byte) (map[string]string, error) {
	if len(b) == 0 || b[0] != evidenceFormat {
		return nil, fmt.Errorf("packed evidence: not of format %d", evidenceFormat)
	}
	b = b[1:]
	out := map[string]string{}
	str := func() (string, error) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", errPackedTruncated
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, nil
	}
	for len(b) > 0 {
		c, w := binary.Uvarint(b)
		if w <= 0 {
			return nil, errPackedTruncated
		}
		b = b[w:]
		var (
			k   string
			err error
		)
		switch {
		case c == 0:
			if k, err = str(); err != nil {
				return nil, err
			}
		case c <= uint64(len(packedKeys)):
			k = packedKeys[c-1]
		default:
			return nil, fmt.Errorf("packed evidence: key code %d unknown", c)
		}
		v, err := str()
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// readEvidence reads a decision's evidence from either column: packed
// (from migration 014 on), else the jsonb of an older row, else none.
func readEvidence(packed, jsonb []byte) (map[string]string, error) {
	switch {
	case packed != nil:
		return unpackEvidence(packed)
	case jsonb != nil:
		var ev map[string]string
		if err := json.Unmarshal(jsonb, &ev); err != nil {
			return nil, fmt.Errorf("evidence: %w", err)
		}
		return ev, nil
	}
	return map[string]string{}, nil
}
