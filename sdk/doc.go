// Package sdk is the contract between the reaper host (reaperd) and its
// plugins: the Go interfaces (Plugin, Reaper, Substrate, Board, Executions),
// the wire types and decision labels, the versioned gRPC protocol that
// carries them between processes, and Serve, which turns a plugin's Go value
// into a plugin binary.
//
// Plain Go first: a Reaper is an ordinary Go value that tests and benchmarks
// call in-process; the gRPC adapters in this package make the same value work
// out of process over hashicorp/go-plugin, with the board and the substrate
// served back to it by the host through the go-plugin broker.
package sdk
