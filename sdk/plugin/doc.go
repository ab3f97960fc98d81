// Package plugin is the transport between reaperd and its plugins: the
// versioned gRPC protocol (proto/reaperv1), the hashicorp/go-plugin
// wrappers and handshake the host dispenses plugins with, the adapters that
// make an sdk.Reaper or sdk.Substrate answer over gRPC, with the board and
// the substrate served back through the go-plugin broker, and Serve, which
// turns a plugin's Go value into a plugin binary:
//
//	func main() { plugin.Serve(agentlost.New) }
//
// What the protocol does to be fast (times as integers, decisions sharing
// their evidence keys, the next page of a listing read ahead while the
// plugin works on the current one, decisions streamed while a pass goes
// on) stays behind the adapters: plugin code sees only the sdk contract.
package plugin
