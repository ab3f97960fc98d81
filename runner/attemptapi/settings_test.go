package attemptapi_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// FitLadder gives a configuration without a window the largest the ladder
// allows, sets the client rates per heartbeat, and holds a given window to
// a tenth of the heartbeat and of agent_lost - heartbeat.
func TestSettingsFitTheLadder(t *testing.T) {
	l := ladder.Defaults()
	s := attemptapi.DefaultSettings()
	if rule := s.FitLadder(l, false); rule != "" || s.HeartbeatWindow != attemptapi.HeartbeatWindowDefault || s.Clients.Per != l.Heartbeat {
		t.Fatalf("default: rule %q, window %s, per %s", rule, s.HeartbeatWindow, s.Clients.Per)
	}
	l.Heartbeat, l.AgentLost = 100*time.Millisecond, 150*time.Millisecond
	if rule := s.FitLadder(l, false); rule != "" || s.HeartbeatWindow != 5*time.Millisecond {
		t.Fatalf("low ladder: rule %q, window %s, want 5ms", rule, s.HeartbeatWindow)
	}
	for w, want := range map[time.Duration]string{
		-time.Millisecond: "must not be negative", 11 * time.Millisecond: "a tenth of the heartbeat",
		6 * time.Millisecond: "a tenth of agent_lost - heartbeat", 5 * time.Millisecond: "",
	} {
		s.HeartbeatWindow = w
		if rule := s.FitLadder(l, true); (want == "") != (rule == "") || !strings.Contains(rule, want) {
			t.Errorf("window %s: rule %q, want %q", w, rule, want)
		}
	}
}

// The block's refusals: the certificate pair, tls_ca alone, and an
// address off loopback without a certificate.
func TestBlockRefusals(t *testing.T) {
	b := attemptapi.DefaultBlock()
	b.TLSKey, b.TLSCA, b.Listen, b.TokenInFlight = "k.pem", "ca.pem", "10.0.0.5:9465", 0
	s, problems := b.Settings()
	var summaries []string
	for _, p := range problems {
		summaries = append(summaries, p.Summary)
	}
	want := []string{"", "Incomplete attempt API certificate", "tls_ca without a certificate", "Attempt API off loopback without a certificate"}
	if strings.Join(summaries, "|") != strings.Join(want, "|") || s.Clients.SubjectInFlight != 1 {
		t.Fatalf("refused %q, want %q; clients %+v", summaries, want, s.Clients)
	}
}
