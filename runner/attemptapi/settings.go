package attemptapi

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/settingrule"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// ListenDefault is attempt_api.listen's default.
const ListenDefault = "127.0.0.1:9465"

// HeartbeatWindowDefault is attempt_api.heartbeat_window's default: how
// long a batch of heartbeats waits for company before it is written. On a
// ladder moved so low that it would break the window's rules (tests run
// heartbeats of 100ms), the default is the largest window they allow
// (DefaultHeartbeatWindow); a window given in the file is held to them
// (Settings.FitLadder).
const HeartbeatWindowDefault = 20 * time.Millisecond

// heartbeatWindowShare is how small the window must be beside the
// ladder's heartbeat and beside the silence agent_lost allows a live
// agent on top of it (agent_lost - heartbeat): at most a tenth of each.
const heartbeatWindowShare = 10

// DefaultHeartbeatWindow is the window of a configuration that sets none:
// HeartbeatWindowDefault, or less on a ladder whose rules want less.
func DefaultHeartbeatWindow(l ladder.Ladder) time.Duration {
	w := min(HeartbeatWindowDefault, l.Heartbeat/heartbeatWindowShare)
	if l.AgentLost > l.Heartbeat {
		w = min(w, (l.AgentLost-l.Heartbeat)/heartbeatWindowShare)
	}
	return max(w, 0)
}

// DefaultStateDir is attempt_api.state_dir's default.
func DefaultStateDir() string {
	return filepath.Join(os.TempDir(), "dexaflow-attempt-api-"+strconv.Itoa(os.Getuid()))
}

// Settings is the attempt_api block of reaperd's configuration: where
// every replica serves the attempt API agents report through, and the
// keys and certificate it uses. host/config decodes it (Block) and holds
// it to the ladder (FitLadder); the daemon makes a Service of it.
type Settings struct {
	Listen    string // host:port
	Advertise string // the base URL agents dial; default https://<bound address>
	// TLSCert and TLSKey are the operator's certificate and key; both empty:
	// a certificate for loopback use is generated once into StateDir.
	TLSCert, TLSKey string
	// TLSCA is the PEM agents are told to trust; default TLSCert.
	TLSCA string
	// SigningKeyFile is the operator's key file (HCL, current and previous
	// keys); empty: a key generated once into StateDir.
	SigningKeyFile string
	// StateDir holds what reaperd generates (signing key, loopback
	// certificate). Default: DefaultStateDir.
	StateDir string
	// Limits bound the server's connections (the keys of the telemetry
	// block's limits).
	Limits httplimit.Limits
	// HeartbeatWindow is how long a batch of heartbeats waits for company
	// before it is written (ServerConfig.HeartbeatWindow); 0: written as
	// soon as a writer is free. Default HeartbeatWindowDefault.
	HeartbeatWindow time.Duration
	// Clients bound one client's connections and calls
	// (httplimit.DefaultAttemptAPIClients): the rates are per ladder
	// heartbeat (Per is set from the ladder).
	Clients httplimit.Clients
}

// DefaultSettings are the attempt_api block's settings when the file has
// none.
func DefaultSettings() Settings {
	return Settings{Listen: ListenDefault, StateDir: DefaultStateDir(), Limits: httplimit.DefaultAttemptAPI(),
		HeartbeatWindow: HeartbeatWindowDefault, Clients: httplimit.DefaultAttemptAPIClients(ladder.Defaults().Heartbeat)}
}

// Block is the attempt_api block as written, its server limits apart (the
// keys it shares with the telemetry block). The per-client bounds are read
// as numbers, not ints, so that Settings words the refusal of 0 or 1.5.
type Block struct {
	Listen         string `reaper:"listen"`
	Advertise      string `reaper:"advertise"`
	TLSCert        string `reaper:"tls_cert"`
	TLSKey         string `reaper:"tls_key"`
	TLSCA          string `reaper:"tls_ca"`
	SigningKeyFile string `reaper:"signing_key_file"`
	StateDir       string `reaper:"state_dir"`
	// HeartbeatWindow is read as given; Settings.FitLadder holds it to the
	// ladder once the whole file is read.
	HeartbeatWindow    time.Duration `reaper:"heartbeat_window"`
	MaxConnsPerAddress float64       `reaper:"max_connections_per_address"`
	AddressRequests    float64       `reaper:"address_requests_per_heartbeat"`
	TokenRequests      float64       `reaper:"token_requests_per_heartbeat"`
	TokenInFlight      float64       `reaper:"token_calls_in_flight"`
}

// DefaultBlock is the attempt_api block's defaults: what a block that
// leaves a key out has.
func DefaultBlock() Block {
	cd := httplimit.DefaultAttemptAPIClients(ladder.Defaults().Heartbeat)
	return Block{Listen: ListenDefault, HeartbeatWindow: HeartbeatWindowDefault,
		MaxConnsPerAddress: float64(cd.MaxConnsPerAddress), AddressRequests: float64(cd.AddressRequests),
		TokenRequests: float64(cd.SubjectRequests), TokenInFlight: float64(cd.SubjectInFlight)}
}

// Settings holds the block to its rules: the settings it makes (Limits
// are the caller's, from the keys the block shares with telemetry; the
// paths are as written, and StateDir "" for the caller to default once it
// has made them relative to the file), and each value refused, in the
// order of the block's rules.
func (b Block) Settings() (Settings, []settingrule.Problem) {
	var problems []settingrule.Problem
	whole := func(key string, n float64) int {
		if n < 1 || n != float64(int(n)) {
			problems = append(problems, settingrule.At(key, key+" must be a whole number, 1 or more."))
			return 1
		}
		return int(n)
	}
	s := Settings{
		Listen: b.Listen, Advertise: b.Advertise, TLSCert: b.TLSCert, TLSKey: b.TLSKey, TLSCA: b.TLSCA,
		SigningKeyFile: b.SigningKeyFile, StateDir: b.StateDir, HeartbeatWindow: b.HeartbeatWindow,
		Clients: httplimit.Clients{
			MaxConnsPerAddress: whole("max_connections_per_address", b.MaxConnsPerAddress),
			AddressRequests:    whole("address_requests_per_heartbeat", b.AddressRequests),
			SubjectRequests:    whole("token_requests_per_heartbeat", b.TokenRequests),
			SubjectInFlight:    whole("token_calls_in_flight", b.TokenInFlight),
			Per:                ladder.Defaults().Heartbeat,
		},
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		problems = append(problems, settingrule.Problem{Keys: []string{"tls_key", "tls_cert"},
			Summary: "Incomplete attempt API certificate", Detail: "tls_cert and tls_key go together."})
	}
	if s.TLSCA != "" && s.TLSCert == "" {
		problems = append(problems, settingrule.Problem{Keys: []string{"tls_ca"},
			Summary: "tls_ca without a certificate", Detail: "tls_ca names what agents trust for the operator's tls_cert; give tls_cert and tls_key."})
	}
	if s.TLSCert == "" && !loopbackListen(s.Listen) {
		problems = append(problems, settingrule.Problem{Keys: []string{"listen"},
			Summary: "Attempt API off loopback without a certificate",
			Detail:  fmt.Sprintf("listen %q is not a loopback address: give tls_cert and tls_key (the generated certificate is for loopback use only).", s.Listen)})
	}
	return s, problems
}

// FitLadder holds the settings to the ladder l, once the whole file is
// read (the block may come before the ladder): the per-client call rates
// are per heartbeat; a window not given (windowGiven false) is the
// ladder's default (DefaultHeartbeatWindow); a given one that is negative
// or not far below the ladder is refused, the rule it breaks returned ("":
// none). The window must be at most a tenth of the heartbeat, and a tenth
// of agent_lost - heartbeat (the silence the agent-lost reaper allows a
// live agent past its heartbeat, which the window's delay of each write
// eats into).
func (s *Settings) FitLadder(l ladder.Ladder, windowGiven bool) string {
	s.Clients.Per = l.Heartbeat
	if !windowGiven {
		s.HeartbeatWindow = DefaultHeartbeatWindow(l)
		return ""
	}
	w := s.HeartbeatWindow
	switch {
	case w < 0:
		return fmt.Sprintf("attempt_api.heartbeat_window (%s) must not be negative (0: no window)", ladder.Format(w))
	case w > l.Heartbeat/heartbeatWindowShare:
		return fmt.Sprintf("attempt_api.heartbeat_window (%s) must be at most a tenth of the heartbeat (%s): "+
			"every heartbeat's write and answer wait up to one window", ladder.Format(w), ladder.Format(l.Heartbeat))
	case l.AgentLost > l.Heartbeat && w > (l.AgentLost-l.Heartbeat)/heartbeatWindowShare:
		return fmt.Sprintf("attempt_api.heartbeat_window (%s) must be at most a tenth of agent_lost - heartbeat (%s - %s): "+
			"a live agent's recorded silence grows by up to one window", ladder.Format(w),
			ladder.Format(l.AgentLost), ladder.Format(l.Heartbeat))
	}
	return ""
}

// loopbackListen reports whether host:port names a loopback host.
func loopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
