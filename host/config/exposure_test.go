package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/internal/httplimit"
)

// TestLadderArithmeticOverflowRefusedAtValidate: a threshold so large that
// the ladder's own arithmetic (2 x interval, grace + 2 x interval, the
// valve, ceiling + TTL, 2 x heartbeat) wraps to a negative duration would
// pass the rules it breaks; it is refused, naming the key and its line.
func TestLadderArithmeticOverflowRefusedAtValidate(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"MaintenanceIntervalTwiceOverflows", minimal + "maintenance {\n  interval = \"1500000h\"\n}\n",
			[]string{"reaper.hcl:4:14:", "2 x maintenance.interval overflows", "maintenance.interval is too large"}},
		{"MaintenanceIntervalOverflowsOnKubeToo", kubeMinimal + "maintenance {\n  interval = \"1500000h\"\n}\n",
			[]string{"reaper.hcl:4:14:", "maintenance.interval is too large"}},
		{"SettlingValveOverflows", minimal + "ladder {\n  settling_grace = \"1500000h\"\n  attempt_token_ttl = \"1600000h\"\n}\n" +
			"auth {\n  max_attempt_credential_lifetime = \"0s\"\n}\n",
			[]string{"reaper.hcl:4:20:", "2 x settling_grace overflows"}},
		{"CeilingPlusTTLOverflows", minimal + "auth {\n  max_attempt_credential_lifetime = \"2562047h47m\"\n}\n",
			[]string{"reaper.hcl:4:37:", "auth.max_attempt_credential_lifetime + attempt_token_ttl overflows"}},
		{"KubeRunnerGracePlusIntervalsOverflows", kubeMinimal + "runner {\n  kube {\n    image = \"x\"\n    termination_grace = \"2562047h47m\"\n  }\n}\n",
			[]string{"reaper.hcl:6:25:", "runner.kube.termination_grace + 2 x maintenance.interval overflows"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestKeyFilesReadableByOthersRefused: a private key file (tls_key,
// signing_key_file) that group or others may read is refused at validate,
// naming the file, at its key; 0600 passes. A certificate others may write
// is a warning naming it; one others may only read is public and fine.
func TestKeyFilesReadableByOthersRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	api := func(cert, key, keys string) string {
		return minimal + "attempt_api {\n  tls_cert = \"" + cert + "\"\n  tls_key = \"" + key + "\"\n  signing_key_file = \"" + keys + "\"\n}\n"
	}
	cert, certWritable := write("api.crt", 0o644), write("writable.crt", 0o666)
	key, keyOpen := write("api.key", 0o600), write("open.key", 0o644)
	keys, keysGroup := write("keys.hcl", 0o400), write("group-keys.hcl", 0o640)

	t.Run("PrivateKey0644Refused", func(t *testing.T) {
		_, err := parse(t, api(cert, keyOpen, keys), nil)
		if err == nil || !strings.Contains(err.Error(), "reaper.hcl:5:13:") || !strings.Contains(err.Error(), "key file "+keyOpen+" refused") ||
			!strings.Contains(err.Error(), "0644") {
			t.Fatalf("tls_key 0644: %v", err)
		}
	})
	t.Run("SigningKeyFileGroupReadableRefused", func(t *testing.T) {
		_, err := parse(t, api(cert, key, keysGroup), nil)
		if err == nil || !strings.Contains(err.Error(), "reaper.hcl:6:22:") || !strings.Contains(err.Error(), keysGroup) {
			t.Fatalf("signing_key_file 0640 of this user: %v", err)
		}
	})
	t.Run("PrivateFilesAccepted", func(t *testing.T) {
		cfg, err := parse(t, api(cert, key, keys), nil)
		if err != nil {
			t.Fatalf("0600 key, 0400 key file, 0644 certificate: %v", err)
		}
		if len(cfg.Warnings) != 0 {
			t.Errorf("warnings for a world-readable certificate: %v", cfg.Warnings)
		}
	})
	t.Run("CertificateWritableByOthersWarned", func(t *testing.T) {
		cfg, err := parse(t, api(certWritable, key, keys), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], certWritable) || !strings.Contains(cfg.Warnings[0], "reaper.hcl:4:") {
			t.Fatalf("warnings %v, want one naming %s", cfg.Warnings, certWritable)
		}
	})
}

// TestServerLimitKeys: the telemetry and attempt_api blocks take the
// servers' timeouts and connection cap over their defaults, and refuse
// one that is not positive at its key.
func TestServerLimitKeys(t *testing.T) {
	cfg, err := parse(t, minimal+"telemetry {\n  read_header_timeout = \"2s\"\n  max_connections = 16\n}\n"+
		"attempt_api {\n  idle_timeout = \"30s\"\n}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantTel := httplimit.DefaultTelemetry()
	wantTel.ReadHeaderTimeout, wantTel.MaxConns = 2*time.Second, 16
	if cfg.Telemetry.Limits != wantTel {
		t.Errorf("telemetry limits %+v, want %+v", cfg.Telemetry.Limits, wantTel)
	}
	wantAPI := httplimit.DefaultAttemptAPI()
	wantAPI.IdleTimeout = 30 * time.Second
	if cfg.AttemptAPI.Limits != wantAPI {
		t.Errorf("attempt api limits %+v, want %+v", cfg.AttemptAPI.Limits, wantAPI)
	}
	if d, err := parse(t, minimal, nil); err != nil || d.Telemetry.Limits != httplimit.DefaultTelemetry() || d.AttemptAPI.Limits != httplimit.DefaultAttemptAPI() {
		t.Errorf("defaults: %+v %+v %v", d.Telemetry.Limits, d.AttemptAPI.Limits, err)
	}
	for _, tc := range []struct{ src, want string }{
		{"telemetry {\n  max_connections = 0\n}\n", "reaper.hcl:4:21:"},
		{"telemetry {\n  max_connections = 1.5\n}\n", "reaper.hcl:4:21:"},
		{"telemetry {\n  idle_timeout = \"0s\"\n}\n", "reaper.hcl:4:18:"},
		{"attempt_api {\n  read_header_timeout = \"-1s\"\n}\n", "reaper.hcl:4:25:"},
		{"attempt_api {\n  read_header_timeout = \"1m\"\n  read_timeout = \"10s\"\n}\n", "must not be longer than read_timeout"},
	} {
		if _, err := parse(t, minimal+tc.src, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.src, err, tc.want)
		}
	}
}

// TestAttemptAPIClientBoundKeys: the attempt_api block takes the
// per-client bounds over their defaults, their rates counted per ladder
// heartbeat (the default sized from it: a faster ladder allows as many
// calls per heartbeat), and refuses one that is not a whole number of at
// least 1 at its key.
func TestAttemptAPIClientBoundKeys(t *testing.T) {
	cfg, err := parse(t, minimal+"ladder {\n  heartbeat = \"5s\"\n}\n"+
		"attempt_api {\n  max_connections_per_address = 8\n  token_requests_per_heartbeat = 12\n}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := httplimit.DefaultAttemptAPIClients(5 * time.Second)
	want.MaxConnsPerAddress, want.SubjectRequests = 8, 12
	if cfg.AttemptAPI.Clients != want {
		t.Errorf("attempt api client bounds %+v, want %+v", cfg.AttemptAPI.Clients, want)
	}
	if d, err := parse(t, minimal, nil); err != nil || d.AttemptAPI.Clients != httplimit.DefaultAttemptAPIClients(15*time.Second) {
		t.Errorf("defaults: %+v %v", d.AttemptAPI.Clients, err)
	}
	for _, tc := range []struct{ src, want string }{
		{"attempt_api {\n  max_connections_per_address = 0\n}\n", "reaper.hcl:4:33:"},
		{"attempt_api {\n  address_requests_per_heartbeat = 2.5\n}\n", "reaper.hcl:4:36:"},
		{"attempt_api {\n  token_requests_per_heartbeat = -1\n}\n", "reaper.hcl:4:34:"},
		{"attempt_api {\n  token_calls_in_flight = 0\n}\n", "reaper.hcl:4:27:"},
	} {
		if _, err := parse(t, minimal+tc.src, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.src, err, tc.want)
		}
	}
}

// TestTelemetryHostFromTheEnvironment: REAPER_TELEMETRY_HOST (the pod's IP
// in the chart) takes the place of telemetry.listen's host, IPv6 too, and
// loopback on the same port is kept for the pod itself; a value that is
// not an IP is refused.
func TestTelemetryHostFromTheEnvironment(t *testing.T) {
	src := minimal + "telemetry {\n  listen = \":9464\"\n}\n"
	for host, want := range map[string][2]string{"10.1.2.3": {"10.1.2.3:9464", "127.0.0.1:9464"},
		"fd00::7": {"[fd00::7]:9464", "127.0.0.1:9464"}, "": {":9464", ""}, "127.0.0.1": {"127.0.0.1:9464", ""}} {
		cfg, err := parse(t, src, map[string]string{config.EnvTelemetryHost: host})
		if err != nil || cfg.Telemetry.Listen != want[0] || cfg.Telemetry.Loopback != want[1] {
			t.Errorf("%s=%q: listen %q, loopback %q (%v), want %q", config.EnvTelemetryHost, host,
				cfg.Telemetry.Listen, cfg.Telemetry.Loopback, err, want)
		}
	}
	if _, err := parse(t, src, map[string]string{config.EnvTelemetryHost: "pod.example"}); err == nil ||
		!strings.Contains(err.Error(), "reaper.hcl:4:12:") {
		t.Errorf("a host name: %v", err)
	}
}
