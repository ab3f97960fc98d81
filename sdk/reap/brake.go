package reap

import (
	"fmt"
	"strconv"
)

// Brake holds back marks decided on heartbeat silence alone — no substrate
// said the attempt is dead. When such marks exceed a share of the attempts
// a pass judged, the likelier cause is the control plane (heartbeats not
// being received or recorded) rather than mass agent death, so the pass
// marks only a few of them and says so. Marks backed by a positive signal
// (a process or pod read dead) are never held back and never counted here.
type Brake struct {
	// Share: the brake engages when silence-only marks exceed this share
	// of the attempts judged in the pass. 1 disables the brake.
	Share float64 `reaper:"brake_share" help:"the brake engages when marks decided on heartbeat silence alone exceed this share (0 < share <= 1; 1 disables) of the attempts judged in a pass"`
	// Min: the share applies only once the pass judged at least this many
	// attempts, so one wedged agent among few attempts is not braked.
	Min int `reaper:"brake_min" help:"attempts a pass must judge before the brake's share applies"`
	// Max: with the brake engaged, at most this many silence-only marks are
	// applied in the pass (oldest silence first); the rest are deferred.
	Max int `reaper:"brake_max" help:"with the brake engaged, most marks on silence alone applied in one pass"`
}

// Validate checks the brake's settings.
func (b Brake) Validate() error {
	switch {
	case !(b.Share > 0 && b.Share <= 1):
		return fmt.Errorf("attribute %q: must be greater than 0 and at most 1, got %g", "brake_share", b.Share)
	case b.Min < 0:
		return fmt.Errorf("attribute %q: must not be negative, got %d", "brake_min", b.Min)
	case b.Max < 0:
		return fmt.Errorf("attribute %q: must not be negative, got %d", "brake_max", b.Max)
	}
	return nil
}

// Brake defaults.
const (
	BrakeShareDefault = 0.5
	BrakeMinDefault   = 20
	BrakeMaxDefault   = 10
)

// DefaultBrake is the brake with its defaults.
func DefaultBrake() Brake {
	return Brake{Share: BrakeShareDefault, Min: BrakeMinDefault, Max: BrakeMaxDefault}
}

// BrakeVerdict is the brake's judgment of one pass.
type BrakeVerdict struct {
	Engaged     bool
	Allowed     int // silence-only marks that may be applied
	Judged      int
	SilenceOnly int
}

// Judge decides, for a pass that judged `judged` attempts and would make
// `silenceOnly` marks on silence alone, how many of those marks may go
// ahead.
func (b Brake) Judge(judged, silenceOnly int) BrakeVerdict {
	v := BrakeVerdict{Allowed: silenceOnly, Judged: judged, SilenceOnly: silenceOnly}
	if judged >= b.Min && judged > 0 && float64(silenceOnly) > b.Share*float64(judged) {
		v.Engaged = true
		v.Allowed = min(silenceOnly, b.Max)
	}
	return v
}

// Evidence describes the verdict for a held-back attempt's decision.
func (v BrakeVerdict) Evidence(b Brake) Evidence {
	return Evidence{
		EvBrakeJudged:      strconv.Itoa(v.Judged),
		EvBrakeSilenceOnly: strconv.Itoa(v.SilenceOnly),
		EvBrakeAllowed:     strconv.Itoa(v.Allowed),
		EvBrakeShare:       strconv.FormatFloat(b.Share, 'g', -1, 64),
	}
}

// Detail is the one-line account of an engaged brake.
func (v BrakeVerdict) Detail(b Brake) string {
	return fmt.Sprintf("brake engaged: %d of %d attempts judged would be marked on heartbeat silence alone (share limit %g); marking %d, deferring %d",
		v.SilenceOnly, v.Judged, b.Share, v.Allowed, v.SilenceOnly-v.Allowed)
}
