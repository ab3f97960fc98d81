// Package sdk is the contract between the reaper host (reaperd) and its
// plugins, and the only package a plugin author needs for it: the Go
// interfaces (Plugin, Reaper, Substrate, Board, Executions, Sink), the
// attempt, candidate, mark and decision types, the board's states, the
// specification's decision labels, and the configuration schema with its
// typed decoding (SchemaOf, Values.Decode). It imports nothing beyond the
// standard library and its own clock and ladder packages.
//
// Plain Go first: a Reaper is an ordinary Go value that tests and
// benchmarks call in process. Beside this package:
//   - sdk/reap is the toolkit every correct reaper needs: the drain within
//     the phase budget, the brake, the recorder, settle-then-teardown, the
//     cursor state, the shared settings, and Run, one pass from listings;
//   - sdk/plugin is the transport: Serve turns a plugin's Go value into a
//     plugin binary over hashicorp/go-plugin and gRPC, with the board and
//     the substrate served back to it by the host;
//   - sdk/sdktest is a harness for plugin tests: an in-memory board with the
//     real board's guards, a scripted substrate and a fake clock.
package sdk
