package plugin

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/dexaflow/reaper/sdk"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// ServeOption adjusts how a plugin is served.
type ServeOption func(*serveOptions)

type serveOptions struct {
	versions []int
}

// WithProtocolVersions serves the plugin under the given protocol versions
// instead of ProtocolVersion. It exists to test version negotiation; a real
// plugin has no reason to use it.
func WithProtocolVersions(versions ...int) ServeOption {
	return func(o *serveOptions) { o.versions = versions }
}

// GCPercent is the garbage collector's target in the processes that run
// reap passes — a reaper plugin, and the host (reaperd), which serves the
// passes their board and audits their decisions — unless GOGC says
// otherwise. Their live heap is a few megabytes (the host streams a pass's
// decisions to the audit and lets them go) while a large pass turns over
// hundreds (pages, liveness answers, marks and their decisions, encoded and
// decoded): at the runtime's default of 100 the collector runs many times
// a pass and takes a seventh of the process's CPU. At 400 the heap may
// grow to five times the live set before a cycle, still a few tens of
// megabytes. Substrates keep the default: one may hold a large cache of
// the fleet (a Kubernetes informer), whose fivefold would be real memory.
const GCPercent = 400

// TuneGC sets the collector's target to GCPercent, unless GOGC is set, and
// returns the target it replaced (-1 when it left it alone) for a caller
// that must put it back.
func TuneGC() int {
	if os.Getenv("GOGC") != "" {
		return -1
	}
	return debug.SetGCPercent(GCPercent)
}

// Serve runs a plugin binary: it builds the plugin from factory with a JSON
// logger on stderr (which the host re-emits under the plugin's name) and
// serves it over gRPC until the host kills it. A plugin's main is one line:
//
//	func main() { plugin.Serve(agentlost.New) }
func Serve[P sdk.Plugin](factory func(hclog.Logger) P, opts ...ServeOption) {
	o := serveOptions{versions: []int{ProtocolVersion}}
	for _, opt := range opts {
		opt(&o)
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Level:      hclog.Trace,
		Output:     os.Stderr,
		JSONFormat: true,
	})
	impl := factory(logger)

	var set plugin.PluginSet
	switch p := any(impl).(type) {
	case sdk.Reaper:
		set = plugin.PluginSet{PluginReaper: &ReaperPlugin{Impl: p}}
		TuneGC()
	case sdk.Substrate:
		set = plugin.PluginSet{PluginSubstrate: &SubstratePlugin{Impl: p}}
	default:
		fmt.Fprintf(os.Stderr, "reaper sdk: %T is neither a Reaper nor a Substrate\n", impl)
		os.Exit(1)
	}
	versioned := make(map[int]plugin.PluginSet, len(o.versions))
	for _, v := range o.versions {
		versioned[v] = set
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake(),
		VersionedPlugins: versioned,
		GRPCServer:       func(opts []grpc.ServerOption) *grpc.Server { return grpc.NewServer(ServerOptions(opts...)...) },
		Logger:           logger,
	})
}
