package reap

import "fmt"

// The settings every reaper of this module shares, as structs a reaper's
// configuration embeds (sdk.SchemaOf declares them, sdk.Values.Decode
// reads and validates them):
//
//	type Config struct {
//		reap.PolicySetting
//		reap.DrainSetting
//		reap.Brake
//	}

// Policy says what becomes of an attempt failed on the infra rail.
type Policy string

// Policies.
const (
	// PolicyReplace re-places the attempt: the planner starts a new
	// execution on the infra budget, off the task's retries.
	PolicyReplace Policy = "replace"
	// PolicyHold fails the attempt and holds it for an operator's review:
	// never re-placed until released. For calibrating a new reaper.
	PolicyHold Policy = "hold"
)

// PolicySetting is the policy attribute.
type PolicySetting struct {
	Policy Policy `reaper:"policy" help:"what becomes of an attempt failed on the infra rail: \"replace\" (re-placed by the planner on the infra budget) or \"hold\" (failed and held for an operator's review, never re-placed until released)"`
}

// DefaultPolicy is the policy setting by default: replace.
func DefaultPolicy() PolicySetting { return PolicySetting{Policy: PolicyReplace} }

// Validate checks the policy.
func (p PolicySetting) Validate() error {
	if p.Policy != PolicyReplace && p.Policy != PolicyHold {
		return fmt.Errorf("attribute %q: must be %q or %q, got %q", "policy", PolicyReplace, PolicyHold, p.Policy)
	}
	return nil
}

// Hold reports whether infra marks are held for review.
func (p PolicySetting) Hold() bool { return p.Policy == PolicyHold }

// DrainSetting bounds how far one pass drains each listing.
type DrainSetting struct {
	MaxPages int `reaper:"drain_max_pages" help:"most pages read from each listing in one pass (the first of 100 rows, the next up to 1,000 as the budget fits); 0: as many as the phase budget allows"`
}

// Validate checks the drain bound.
func (d DrainSetting) Validate() error {
	if d.MaxPages < 0 {
		return fmt.Errorf("attribute %q: must not be negative, got %d", "drain_max_pages", d.MaxPages)
	}
	return nil
}
