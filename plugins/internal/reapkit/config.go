package reapkit

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/dexaflow/reaper/sdk"
)

// Attribute names shared by the reapers' configuration blocks.
const (
	AttrPolicy        = "policy"
	AttrBrakeShare    = "brake_share"
	AttrBrakeMin      = "brake_min"
	AttrBrakeMax      = "brake_max"
	AttrDrainMaxPages = "drain_max_pages"
)

// Policies: what becomes of an attempt a reaper fails on the infra rail
// (the orphan-reaper pattern's reset vs hold).
const (
	// PolicyReplace: the planner re-places the attempt on the infra budget.
	PolicyReplace = "replace"
	// PolicyHold: the attempt is failed and held for an operator's review,
	// never re-placed until released.
	PolicyHold = "hold"
)

// PolicyAttribute declares `policy`.
func PolicyAttribute() sdk.Attribute {
	return sdk.Attribute{Name: AttrPolicy, Type: sdk.TypeString, Default: PolicyReplace,
		Description: `what becomes of an attempt failed on the infra rail: "replace" (re-placed by the planner on the infra budget) or "hold" (failed and held for an operator's review, never re-placed until released)`}
}

// DrainAttribute declares `drain_max_pages`.
func DrainAttribute() sdk.Attribute {
	return sdk.Attribute{Name: AttrDrainMaxPages, Type: sdk.TypeNumber, Default: float64(0),
		Description: "most pages of 100 candidates read from each listing in one pass; 0: as many as the phase budget allows"}
}

// BrakeAttributes declares `brake_share`, `brake_min` and `brake_max`.
func BrakeAttributes() []sdk.Attribute {
	return []sdk.Attribute{
		{Name: AttrBrakeShare, Type: sdk.TypeNumber, Default: BrakeShareDefault,
			Description: "the brake engages when marks decided on heartbeat silence alone exceed this share (0 < share <= 1; 1 disables) of the attempts judged in a pass"},
		{Name: AttrBrakeMin, Type: sdk.TypeNumber, Default: float64(BrakeMinDefault),
			Description: "attempts a pass must judge before the brake's share applies"},
		{Name: AttrBrakeMax, Type: sdk.TypeNumber, Default: float64(BrakeMaxDefault),
			Description: "with the brake engaged, most marks on silence alone applied in one pass"},
	}
}

// CheckKnown refuses keys the schema does not declare.
func CheckKnown(s sdk.Schema, v sdk.Values) error {
	for key := range v {
		if !slices.ContainsFunc(s.Attributes, func(a sdk.Attribute) bool { return a.Name == key }) {
			return fmt.Errorf("attribute %q: not a setting of this reaper", key)
		}
	}
	return nil
}

// ParsePolicy reads `policy` (absent: replace).
func ParsePolicy(v sdk.Values) (string, error) {
	raw, ok := v[AttrPolicy]
	if !ok || raw == nil {
		return PolicyReplace, nil
	}
	p, ok := raw.(string)
	if !ok || (p != PolicyReplace && p != PolicyHold) {
		return "", fmt.Errorf("attribute %q: must be %q or %q, got %v", AttrPolicy, PolicyReplace, PolicyHold, raw)
	}
	return p, nil
}

// ParseBrake reads the brake attributes (absent: defaults).
func ParseBrake(v sdk.Values) (Brake, error) {
	b := DefaultBrake()
	share, ok, err := number(v, AttrBrakeShare)
	if err != nil {
		return b, err
	}
	if ok {
		if !(share > 0 && share <= 1) {
			return b, fmt.Errorf("attribute %q: must be greater than 0 and at most 1, got %g", AttrBrakeShare, share)
		}
		b.Share = share
	}
	if b.Min, err = wholeNumber(v, AttrBrakeMin, b.Min); err != nil {
		return b, err
	}
	if b.Max, err = wholeNumber(v, AttrBrakeMax, b.Max); err != nil {
		return b, err
	}
	return b, nil
}

// ParseDrainMaxPages reads `drain_max_pages` (absent: 0, no page cap).
func ParseDrainMaxPages(v sdk.Values) (int, error) {
	return wholeNumber(v, AttrDrainMaxPages, 0)
}

func number(v sdk.Values, key string) (float64, bool, error) {
	raw, ok := v[key]
	if !ok || raw == nil {
		return 0, false, nil
	}
	var f float64
	switch n := raw.(type) {
	case float64:
		f = n
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	case json.Number:
		var err error
		if f, err = n.Float64(); err != nil {
			return 0, false, fmt.Errorf("attribute %q: %w", key, err)
		}
	default:
		return 0, false, fmt.Errorf("attribute %q: must be a number, got %T", key, raw)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false, fmt.Errorf("attribute %q: must be a finite number", key)
	}
	return f, true, nil
}

func wholeNumber(v sdk.Values, key string, def int) (int, error) {
	f, ok, err := number(v, key)
	if err != nil || !ok {
		return def, err
	}
	if f < 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		return def, fmt.Errorf("attribute %q: must be a whole number from 0 to %d, got %g", key, math.MaxInt32, f)
	}
	return int(f), nil
}
