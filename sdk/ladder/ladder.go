// Package ladder holds the timing ladder: the thresholds every reaper judges
// by, their defaults, and the inequalities between them that boot checks.
//
// Moving one threshold out of order turns a control-plane restart into false
// reaps (an agent_lost threshold at or under the heartbeat interval, say, reaps
// healthy attempts between two heartbeats), so Validate refuses such a ladder
// and names the keys and the rule it breaks.
package ladder

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Ladder is the set of thresholds. The fields of the ladder block carry its
// HCL keys as reaper tags, so the block decodes into a Ladder as a plugin's
// block decodes into its configuration (sdk.SchemaOf, sdk.Values.Decode);
// MaintenanceInterval is maintenance.interval and CredentialCeiling
// auth.max_attempt_credential_lifetime, keys of other blocks.
type Ladder struct {
	Heartbeat            time.Duration `reaper:"heartbeat"`              // how often a live agent heartbeats
	AgentLost            time.Duration `reaper:"agent_lost"`             // silence after which an agent is presumed lost
	SettlingGrace        time.Duration `reaper:"settling_grace"`         // the leader-settling gate's grace
	AttemptTokenTTL      time.Duration `reaper:"attempt_token_ttl"`      // lifetime of one attempt credential
	DispatchLost         time.Duration `reaper:"dispatch_lost"`          // how long a queued attempt may wait for its start
	PodLostFloor         time.Duration `reaper:"pod_lost_floor"`         // a running attempt's liveness floor (kube)
	OrphanRun            time.Duration `reaper:"orphan_run"`             // quiet time after which a run with nothing live fails
	InfraConfirmValve    time.Duration `reaper:"infra_confirm_valve"`    // when an unconfirmed infra mark is acted on anyway
	TaskTerminationGrace time.Duration `reaper:"task_termination_grace"` // a task container's termination grace
	MaintenanceInterval  time.Duration // maintenance.interval: the cycle period
	CredentialCeiling    time.Duration // auth.max_attempt_credential_lifetime; <= 0 disables the ceiling
}

// Defaults are the specification's values.
func Defaults() Ladder {
	return Ladder{
		Heartbeat:            15 * time.Second,
		AgentLost:            90 * time.Second,
		SettlingGrace:        180 * time.Second,
		AttemptTokenTTL:      10 * time.Minute,
		DispatchLost:         3 * time.Minute,
		PodLostFloor:         60 * time.Second,
		OrphanRun:            5 * time.Minute,
		InfraConfirmValve:    2 * time.Minute,
		TaskTerminationGrace: 30 * time.Second,
		MaintenanceInterval:  30 * time.Second,
		CredentialCeiling:    time.Hour,
	}
}

// Fixed values that are not operator knobs.
const (
	// PageSize is a listing's page: what a reaper reads of a listing in a
	// cycle, and the first page of every listing in a pass.
	PageSize = 100
	// DrainPage is the most rows one board listing returns: the pages a
	// pass reads after its first, while it drains a backlog within its
	// budget, grow up to it.
	DrainPage = 10 * PageSize
	// OrphanStopGrace is how long a stopped group gets after SIGTERM.
	OrphanStopGrace = 10 * time.Second
	// OrphanKillWait is how long to wait after SIGKILL for the group to go.
	OrphanKillWait = 5 * time.Second
	// StartExpiryMargin: a Pending pod whose credential lapses within this is
	// re-placed as start_expired.
	StartExpiryMargin = 2 * time.Minute
)

// Edition names.
const (
	EditionLite = "lite"
	EditionKube = "kube"
)

// SettlingValve is when the settling gate opens regardless: twice the grace.
func (l Ladder) SettlingValve() time.Duration { return 2 * l.SettlingGrace }

// CeilingEnabled reports whether the credential ceiling is in force.
func (l Ladder) CeilingEnabled() bool { return l.CredentialCeiling > 0 }

// WarmAttemptWatchdog is the wall-clock bound a warm worker puts on each
// attempt it runs (warm pods carry no activeDeadlineSeconds): the credential
// ceiling, past which the attempt's credential is no longer renewed. Zero
// when the ceiling is disabled, which disables the watchdog with it.
func (l Ladder) WarmAttemptWatchdog() time.Duration {
	if !l.CeilingEnabled() {
		return 0
	}
	return l.CredentialCeiling
}

// Format renders a duration the way the configuration writes it: "90s",
// "10m", "1h".
func Format(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0 && d >= 10*time.Minute:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

// maxDuration is the longest duration, as the configuration writes it.
const maxDuration = "2562047h47m"

// Violation is one broken rule of the ladder.
type Violation struct {
	Keys []string // the keys involved, the offending one first
	Rule string   // the rule in words, with the values
}

func (v Violation) Error() string { return v.Rule }

// Error lists every violation of a ladder.
type Error struct{ Violations []Violation }

func (e *Error) Error() string {
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Rule
	}
	return "timing ladder out of order: " + strings.Join(parts, "; ")
}

// Warning is an accepted but noteworthy setting.
type Warning struct {
	Key     string
	Message string
}

// Validate checks every inequality of the ladder for the given edition. It
// returns the warnings for accepted settings that disable something, and an
// *Error naming each broken rule.
func (l Ladder) Validate(edition string) ([]Warning, error) {
	var vs []Violation
	less := func(aKey string, a time.Duration, bKey string, b time.Duration) {
		if !(a < b) {
			vs = append(vs, Violation{
				Keys: []string{bKey, aKey},
				Rule: fmt.Sprintf("%s (%s) must be greater than %s (%s)", bKey, Format(b), aKey, Format(a)),
			})
		}
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			vs = append(vs, Violation{Keys: []string{key}, Rule: fmt.Sprintf("%s (%s) must be positive", key, Format(d))})
		}
	}
	// Every sum and multiple of thresholds the rules below, and the
	// reapers, compute must fit a time.Duration: an overflow wraps to a
	// negative duration and would pass a rule it breaks. A key whose
	// arithmetic overflows is refused before any rule reads it.
	overflows := false
	fits := func(what string, keys []string, terms ...time.Duration) {
		var sum time.Duration
		for _, d := range terms {
			if d > 0 && sum > math.MaxInt64-d || d < 0 && sum < math.MinInt64-d {
				vs = append(vs, Violation{Keys: keys,
					Rule: fmt.Sprintf("%s overflows a duration (at most %s): %s is too large", what, maxDuration, keys[0])})
				overflows = true
				return
			}
			sum += d
		}
	}
	fits("2 x maintenance.interval", []string{"maintenance.interval"}, l.MaintenanceInterval, l.MaintenanceInterval)
	fits("task_termination_grace + 2 x maintenance.interval", []string{"task_termination_grace", "maintenance.interval"},
		l.TaskTerminationGrace, l.MaintenanceInterval, l.MaintenanceInterval)
	fits("the settling valve, 2 x settling_grace", []string{"settling_grace"}, l.SettlingGrace, l.SettlingGrace)
	fits("2 x heartbeat", []string{"heartbeat"}, l.Heartbeat, l.Heartbeat)
	fits("auth.max_attempt_credential_lifetime + attempt_token_ttl",
		[]string{"auth.max_attempt_credential_lifetime", "attempt_token_ttl"}, l.CredentialCeiling, l.AttemptTokenTTL)
	if overflows {
		return nil, &Error{Violations: vs}
	}

	positive("heartbeat", l.Heartbeat)
	positive("maintenance.interval", l.MaintenanceInterval)
	positive("dispatch_lost", l.DispatchLost)
	positive("orphan_run", l.OrphanRun)
	positive("pod_lost_floor", l.PodLostFloor)
	positive("infra_confirm_valve", l.InfraConfirmValve)
	if l.TaskTerminationGrace < 0 {
		vs = append(vs, Violation{Keys: []string{"task_termination_grace"},
			Rule: fmt.Sprintf("task_termination_grace (%s) must not be negative", Format(l.TaskTerminationGrace))})
	}

	less("heartbeat", l.Heartbeat, "agent_lost", l.AgentLost)
	less("agent_lost", l.AgentLost, "settling_grace", l.SettlingGrace)
	less("settling_grace", l.SettlingGrace, "attempt_token_ttl", l.AttemptTokenTTL)
	if !(2*l.MaintenanceInterval < l.SettlingGrace) {
		vs = append(vs, Violation{
			Keys: []string{"settling_grace", "maintenance.interval"},
			Rule: fmt.Sprintf("settling_grace (%s) must be greater than 2 x maintenance.interval (%s)",
				Format(l.SettlingGrace), Format(2*l.MaintenanceInterval)),
		})
	}
	if edition == EditionKube {
		floor := l.TaskTerminationGrace + 2*l.MaintenanceInterval
		if !(floor < l.InfraConfirmValve) {
			vs = append(vs, Violation{
				Keys: []string{"infra_confirm_valve", "task_termination_grace", "maintenance.interval"},
				Rule: fmt.Sprintf("infra_confirm_valve (%s) must be greater than task_termination_grace + 2 x maintenance.interval (%s)",
					Format(l.InfraConfirmValve), Format(floor)),
			})
		}
		less("infra_confirm_valve", l.InfraConfirmValve, "orphan_run", l.OrphanRun)
	}

	var warnings []Warning
	if l.CredentialCeiling <= 0 {
		warnings = append(warnings, Warning{
			Key: "auth.max_attempt_credential_lifetime",
			Message: "auth.max_attempt_credential_lifetime is not positive: the credential ceiling " +
				"(attempt credentials are renewed without limit), the task pod deadline floor and the " +
				"warm worker attempt watchdog are all disabled",
		})
	} else if !(l.CredentialCeiling > l.AttemptTokenTTL) {
		vs = append(vs, Violation{
			Keys: []string{"auth.max_attempt_credential_lifetime", "attempt_token_ttl"},
			Rule: fmt.Sprintf("auth.max_attempt_credential_lifetime (%s) must be greater than attempt_token_ttl (%s)",
				Format(l.CredentialCeiling), Format(l.AttemptTokenTTL)),
		})
	}
	if len(vs) > 0 {
		return warnings, &Error{Violations: vs}
	}
	return warnings, nil
}

// ListLimit is the page a board returns for a listing asked for limit:
// PageSize when limit is not positive, at most DrainPage.
func ListLimit(limit int) int {
	switch {
	case limit <= 0:
		return PageSize
	case limit > DrainPage:
		return DrainPage
	}
	return limit
}
