package plugin

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// ProtocolVersion is the newest plugin protocol this SDK speaks. The host
// offers every version in PluginSets; a plugin serves its own; go-plugin
// picks the highest common one, and the host refuses a plugin with none.
const ProtocolVersion = 1

// Plugin set keys, the names passed to Dispense.
const (
	PluginReaper    = "reaper"
	PluginSubstrate = "substrate"
)

// The magic cookie is a guard against running a plugin binary by hand (it
// then says it is a plugin and exits), not a security measure.
const (
	MagicCookieKey   = "REAPER_PLUGIN_MAGIC_COOKIE"
	MagicCookieValue = "d4b0c1a2-reaper-plugin-5e7f"
)

// Handshake returns the fixed handshake shared by the host and every plugin.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion,
		MagicCookieKey:   MagicCookieKey,
		MagicCookieValue: MagicCookieValue,
	}
}

// PluginSets returns the versioned plugin sets the host accepts.
func PluginSets() map[int]plugin.PluginSet { return PluginSetsWithLimit(0) }

// PluginSetsWithLimit is PluginSets whose host side accepts requests of at
// most maxRecv bytes from a plugin on the board and substrate it serves
// back (0: gRPC's default, 4 MiB).
func PluginSetsWithLimit(maxRecv int) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		1: {
			PluginReaper:    &ReaperPlugin{MaxRecv: maxRecv},
			PluginSubstrate: &SubstratePlugin{MaxRecv: maxRecv},
		},
	}
}

// ReaperPlugin is the go-plugin wrapper of a Reaper. On the plugin side Impl
// is served; on the host side the dispensed value is a Reaper client.
type ReaperPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl sdk.Reaper
	// MaxRecv bounds (host side) each request the plugin sends to the
	// host's callbacks, in bytes; 0: gRPC's default.
	MaxRecv int
}

var _ plugin.GRPCPlugin = (*ReaperPlugin)(nil)

// GRPCServer registers the reaper and base services.
func (p *ReaperPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterBaseServer(s, &baseServer{impl: p.Impl})
	pb.RegisterReaperServer(s, &reaperServer{impl: p.Impl, dialer: newBrokerDialer(broker)})
	return nil
}

// GRPCClient returns a Reaper that calls the plugin.
func (p *ReaperPlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &reaperClient{
		baseClient: baseClient{client: pb.NewBaseClient(c)},
		client:     pb.NewReaperClient(c),
		callbacks:  newCallbackServer(broker, p.MaxRecv),
	}, nil
}

// SubstratePlugin is the go-plugin wrapper of a Substrate.
type SubstratePlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl sdk.Substrate
	// MaxRecv is as ReaperPlugin's.
	MaxRecv int
}

var _ plugin.GRPCPlugin = (*SubstratePlugin)(nil)

// GRPCServer registers the substrate and base services.
func (p *SubstratePlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterBaseServer(s, &baseServer{impl: p.Impl})
	pb.RegisterSubstrateServer(s, &substrateServer{exec: p.Impl, full: p.Impl, dialer: newBrokerDialer(broker)})
	return nil
}

// GRPCClient returns a Substrate that calls the plugin.
func (p *SubstratePlugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &substrateClient{
		baseClient: baseClient{client: pb.NewBaseClient(c)},
		client:     pb.NewSubstrateClient(c),
		callbacks:  newCallbackServer(broker, p.MaxRecv),
	}, nil
}

// IsUnavailable reports whether err says the plugin at the other end of a
// call is gone (its process exited or its connection broke), as opposed to
// the plugin answering with an error of its own.
func IsUnavailable(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() == codes.Unavailable {
			return true
		}
	}
	return false
}

// IsReplyTooLarge reports whether err says a message was refused for its
// size (the host's cap on a plugin's replies, or the receiving side's on a
// request).
func IsReplyTooLarge(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() == codes.ResourceExhausted {
			return true
		}
	}
	return false
}
