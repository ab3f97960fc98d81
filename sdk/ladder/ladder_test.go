package ladder_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk/ladder"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name    string
		edition string
		mutate  func(*ladder.Ladder)
		key     string
	}{
		{"HeartbeatBelowAgentLost", "lite", func(l *ladder.Ladder) { l.Heartbeat = l.AgentLost }, "agent_lost"},
		{"AgentLostBelowSettlingGrace", "lite", func(l *ladder.Ladder) { l.AgentLost = l.SettlingGrace }, "settling_grace"},
		{"SettlingGraceBelowTokenTTL", "lite", func(l *ladder.Ladder) { l.AttemptTokenTTL = l.SettlingGrace }, "attempt_token_ttl"},
		{"TwoIntervalsBelowSettlingGrace", "lite", func(l *ladder.Ladder) { l.MaintenanceInterval = 90 * time.Second }, "settling_grace"},
		{"KubeGracePlusTwoIntervalsBelowValve", "kube", func(l *ladder.Ladder) { l.InfraConfirmValve = 90 * time.Second }, "infra_confirm_valve"},
		{"KubeValveBelowOrphanRun", "kube", func(l *ladder.Ladder) { l.OrphanRun = l.InfraConfirmValve }, "orphan_run"},
		{"CeilingAboveTokenTTL", "lite", func(l *ladder.Ladder) { l.CredentialCeiling = l.AttemptTokenTTL }, "auth.max_attempt_credential_lifetime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := ladder.Defaults()
			tc.mutate(&l)
			_, err := l.Validate(tc.edition)
			var lerr *ladder.Error
			if !errors.As(err, &lerr) {
				t.Fatalf("err = %v, want *ladder.Error", err)
			}
			if len(lerr.Violations) != 1 || lerr.Violations[0].Keys[0] != tc.key {
				t.Fatalf("violations = %+v, want one naming %q first", lerr.Violations, tc.key)
			}
		})
	}
	t.Run("DefaultsPass", func(t *testing.T) {
		for _, ed := range []string{ladder.EditionLite, ladder.EditionKube} {
			if w, err := ladder.Defaults().Validate(ed); err != nil || len(w) != 0 {
				t.Fatalf("%s: warnings %v, err %v", ed, w, err)
			}
		}
	})
	t.Run("NonPositiveCeilingWarns", func(t *testing.T) {
		l := ladder.Defaults()
		l.CredentialCeiling = -1
		w, err := l.Validate(ladder.EditionLite)
		if err != nil || len(w) != 1 || w[0].Key != "auth.max_attempt_credential_lifetime" {
			t.Fatalf("warnings %v, err %v", w, err)
		}
	})
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 90 * time.Second: "90s", 3 * time.Minute: "180s", 10 * time.Minute: "10m",
		time.Hour: "1h", 1500 * time.Millisecond: "1.5s",
	} {
		if got := ladder.Format(d); got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
	}
}

// The rungs that hold only on Kubernetes (a pod's termination grace and two
// sweeps inside the infra confirmation valve, the valve inside the orphan
// threshold) are checked for the kube edition only: a Lite ladder that breaks
// them validates, the same ladder on kube is refused naming the rung.
func TestKubeOnlyRungsSkippedOnLite(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*ladder.Ladder)
		key    string
	}{
		{"GracePlusTwoIntervalsNotBelowValve_ByTheGrace", func(l *ladder.Ladder) {
			l.TaskTerminationGrace = 5 * time.Minute
		}, "infra_confirm_valve"},
		{"GracePlusTwoIntervalsNotBelowValve_ByTheValve", func(l *ladder.Ladder) {
			l.InfraConfirmValve = l.TaskTerminationGrace + 2*l.MaintenanceInterval
		}, "infra_confirm_valve"},
		{"ValveNotBelowOrphanRun", func(l *ladder.Ladder) { l.InfraConfirmValve = l.OrphanRun }, "orphan_run"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := ladder.Defaults()
			tc.mutate(&l)
			if _, err := l.Validate(ladder.EditionLite); err != nil {
				t.Fatalf("lite refused a kube-only rung: %v", err)
			}
			_, err := l.Validate(ladder.EditionKube)
			var lerr *ladder.Error
			if !errors.As(err, &lerr) || len(lerr.Violations) == 0 || lerr.Violations[0].Keys[0] != tc.key {
				t.Fatalf("kube: err = %v, want a violation naming %q first", err, tc.key)
			}
		})
	}
}

// TestArithmeticThatOverflowsIsRefused: a threshold whose double, or whose
// sum with another, passes the largest duration wraps negative and would
// slip past the rule it breaks; Validate names it instead.
func TestArithmeticThatOverflowsIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*ladder.Ladder)
		key  string
	}{
		{"TwiceTheInterval", func(l *ladder.Ladder) { l.MaintenanceInterval = 1_500_000 * time.Hour }, "maintenance.interval"},
		{"TheSettlingValve", func(l *ladder.Ladder) {
			l.SettlingGrace, l.AttemptTokenTTL, l.CredentialCeiling = 1_500_000*time.Hour, 1_600_000*time.Hour, 0
		}, "settling_grace"},
		{"TwiceTheHeartbeat", func(l *ladder.Ladder) { l.Heartbeat = 1_500_000 * time.Hour }, "heartbeat"},
		{"CeilingPlusTTL", func(l *ladder.Ladder) { l.CredentialCeiling = math.MaxInt64 - time.Minute }, "auth.max_attempt_credential_lifetime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := ladder.Defaults()
			tc.set(&l)
			_, err := l.Validate(ladder.EditionKube)
			var lerr *ladder.Error
			if !errors.As(err, &lerr) || lerr.Violations[0].Keys[0] != tc.key || !strings.Contains(err.Error(), "overflows") {
				t.Fatalf("err = %v, want an overflow naming %s", err, tc.key)
			}
		})
	}
}
