package plugin

import "google.golang.org/grpc"

// flowWindow is the HTTP/2 flow-control window of every connection between
// the host and a plugin, per stream and per connection. gRPC's default
// starts at 64 KiB and grows from round-trip estimates; a drain page (a
// thousand candidates, their liveness answers, their decisions with
// evidence, several hundred KiB) then waits on window updates from the
// other side, a round trip between two processes each time. Both ends are
// on one machine and their messages are bounded, so the window is set
// once, large enough for a drain page.
const flowWindow = 4 << 20

// ServerOptions are the options of every gRPC server of the protocol: the
// plugin's own and the host's callback server on the broker.
func ServerOptions(opts ...grpc.ServerOption) []grpc.ServerOption {
	return append(opts, grpc.InitialWindowSize(flowWindow), grpc.InitialConnWindowSize(flowWindow))
}

// DialOptions are the options of every gRPC client connection of the
// protocol: the host's to a plugin and the plugin's to the host's
// callbacks.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(flowWindow), grpc.WithInitialConnWindowSize(flowWindow)}
}
