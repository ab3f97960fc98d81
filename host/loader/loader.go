// Package loader launches plugin binaries over hashicorp/go-plugin: gRPC
// only, AutoMTLS, a named logger per plugin, an optional sha256 checksum,
// and the highest protocol version both sides speak. A plugin binary is
// trusted only when nobody but reaperd's user (or root) can change it or
// its directory; it is checked, hashed and run as one open file; it starts
// with none of the host's environment but what PassedEnv names, with no
// capability, and (Landlock) unable to open the host's secrets
// (Loader.Secrets, Loader.APICredentials); and what it answers is bounded
// in size (Loader.MaxReply). A plugin that cannot be
// launched is refused with its name and the reason.
package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/plugin"
)

// BinaryName is the file name of a plugin: reaper-<name> for a reaper,
// reaper-substrate-<name> for a substrate.
func BinaryName(kind, name string) string {
	if kind == sdk.KindSubstrate {
		return "reaper-substrate-" + name
	}
	return "reaper-" + name
}

// Spec says which plugin to launch.
type Spec struct {
	Kind   string // sdk.KindReaper or sdk.KindSubstrate
	Name   string // the configured label
	SHA256 string // optional hex checksum of the binary
}

// Loader launches plugins from one directory.
type Loader struct {
	Dir    string
	Logger hclog.Logger
	// Env is added to each plugin's environment (after the host's own).
	Env []string
	// MaxReply bounds each message the host accepts from a plugin, in
	// bytes: its replies, and its requests to the host's board and
	// substrate. A larger one is refused unread (the call fails with
	// ResourceExhausted) and the host goes on. 0: MaxReplyDefault.
	MaxReply int
	// SocketDir is where each plugin gets the directory of its unix sockets
	// (both ends': the plugin's listeners and the host's broker listener),
	// removed when the plugin is killed. The host gives its own (a
	// SocketDir's Path) so that sockets of a host killed with kill -9 can be
	// swept; "" is the system's temporary directory.
	SocketDir string
	// Secrets are reaperd's own secret files and directories (its key
	// files, its DSN file, its configuration: config.Secrets): no plugin
	// may open them. They are hidden with Landlock where the kernel has it
	// (confine.HideFiles; without it the daemon warns once at start).
	Secrets []string
	// APICredentials reach the Kubernetes API server as reaperd: the
	// ServiceAccount token directory (confine.ServiceAccountDir) and the
	// kubeconfig files the configuration names. They are hidden from every
	// reaper plugin; the substrate, which talks to the API server with
	// them, may read them (but not Secrets).
	APICredentials []string

	// beforeStart, when set (tests), runs after the binary was opened and
	// checked and before it is started.
	beforeStart func(path string)
}

// MaxReplyDefault is the largest message the host accepts from a plugin
// unless configured otherwise (plugin_max_reply): a few times a reap
// pass's or a mass sweep's largest legitimate reply, a small part of the
// host's memory.
const MaxReplyDefault = 8 << 20

// Plugin is a launched plugin process.
type Plugin struct {
	Spec   Spec
	Path   string
	Info   sdk.Info
	client *goplugin.Client
	raw    any
}

// Error is a refusal to launch a plugin, naming it and the reason.
type Error struct {
	Kind, Name string
	Path       string
	Err        error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s plugin %q (%s): %v", e.Kind, e.Name, e.Path, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrNoCommonVersion is wrapped when the plugin speaks no protocol version
// the host knows.
var ErrNoCommonVersion = errors.New("speaks no protocol version this host supports")

// Launch starts the plugin, negotiates the protocol, dispenses it and checks
// that it is the kind and name it was configured as. On any failure the
// process is killed before Launch returns.
func (l *Loader) Launch(ctx context.Context, spec Spec) (p *Plugin, err error) {
	path := filepath.Join(l.Dir, BinaryName(spec.Kind, spec.Name))
	fail := func(err error) error { return &Error{Kind: spec.Kind, Name: spec.Name, Path: path, Err: err} }

	// The binary is opened once: checked, hashed and run as this one open
	// file (see openBinary).
	bin, err := openBinary(path)
	if err != nil {
		return nil, fail(err)
	}
	defer bin.Close() // the child has its own descriptor once started
	if spec.SHA256 != "" {
		if err := checkSum(bin, spec.SHA256); err != nil {
			return nil, fail(err)
		}
	}
	logger := l.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	maxReply := l.MaxReply
	if maxReply <= 0 {
		maxReply = MaxReplyDefault
	}
	hidden := l.hidden(spec.Kind)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake(),
		VersionedPlugins: plugin.PluginSetsWithLimit(maxReply),
		RunnerFunc: func(_ hclog.Logger, cmd *exec.Cmd, _ string) (runner.Runner, error) {
			return newProcess(path, bin, cmd, append(passedEnv(os.Environ()), l.Env...), hidden, l.beforeStart)
		},
		// Nothing of the host's environment but what PassedEnv names.
		SkipHostEnv:      true,
		UnixSocketConfig: &goplugin.UnixSocketConfig{TempDir: l.SocketDir},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		GRPCDialOptions: append(plugin.DialOptions(),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReply))),
		Logger:  logger.Named(spec.Name),
		Managed: false,
	})
	defer func() {
		if err != nil {
			client.Kill()
		}
	}()

	rpc, err := client.Client()
	if err != nil {
		return nil, fail(classify(err))
	}
	key := plugin.PluginReaper
	if spec.Kind == sdk.KindSubstrate {
		key = plugin.PluginSubstrate
	}
	raw, err := rpc.Dispense(key)
	if err != nil {
		return nil, fail(fmt.Errorf("dispense %s: %w", key, err))
	}
	base, ok := raw.(sdk.Plugin)
	if !ok {
		return nil, fail(fmt.Errorf("dispensed %T, not a plugin", raw))
	}
	info, err := base.Info(ctx)
	if err != nil {
		return nil, fail(err)
	}
	if info.Kind != spec.Kind {
		return nil, fail(fmt.Errorf("is a %s plugin, configured as a %s", info.Kind, spec.Kind))
	}
	if info.Name != spec.Name {
		return nil, fail(fmt.Errorf("calls itself %q", info.Name))
	}
	// The labels its decisions and marks may carry are fixed here, once:
	// the host meters and audits nothing else from it.
	if err := sdk.CheckDeclared(info); err != nil {
		return nil, fail(err)
	}
	return &Plugin{Spec: spec, Path: path, Info: info, client: client, raw: raw}, nil
}

// hidden is what a plugin of kind may not open: Secrets, and
// APICredentials unless it is the substrate.
func (l *Loader) hidden(kind string) []string {
	out := append([]string(nil), l.Secrets...)
	if kind != sdk.KindSubstrate {
		out = append(out, l.APICredentials...)
	}
	return out
}

// classify turns go-plugin's start-up errors into the reasons an operator
// needs.
func classify(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Incompatible API version"), strings.Contains(msg, "incompatible API version"):
		return fmt.Errorf("%w: %v", ErrNoCommonVersion, err)
	case strings.Contains(msg, "Unrecognized remote plugin message"), strings.Contains(msg, "plugin exited before we could connect"):
		return fmt.Errorf("handshake failed (is it a reaper plugin built with this SDK?): %w", err)
	}
	return fmt.Errorf("start: %w", err)
}

// Reaper returns the plugin as a Reaper, or nil when it is not one.
func (p *Plugin) Reaper() sdk.Reaper {
	r, _ := p.raw.(sdk.Reaper)
	return r
}

// Substrate returns the plugin as a Substrate, or nil when it is not one.
func (p *Plugin) Substrate() sdk.Substrate {
	s, _ := p.raw.(sdk.Substrate)
	return s
}

// Base returns the plugin's base interface.
func (p *Plugin) Base() sdk.Plugin { return p.raw.(sdk.Plugin) }

// ProtocolVersion is the negotiated protocol version.
func (p *Plugin) ProtocolVersion() int { return p.client.NegotiatedVersion() }

// Exited reports whether the plugin process has exited.
func (p *Plugin) Exited() bool { return p.client.Exited() }

// ServesEdition reports whether the plugin declares the edition.
func (p *Plugin) ServesEdition(edition string) bool {
	return len(p.Info.Editions) == 0 || slices.Contains(p.Info.Editions, edition)
}

// Kill stops the plugin process. It is safe to call more than once.
func (p *Plugin) Kill() { p.client.Kill() }
