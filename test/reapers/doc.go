// Package reapers holds the end-to-end tests and benchmarks of the three
// reapers that run on Lite: agentlost, dispatchlost and orphanrun.
//
// The tests put everything real in one place: a PostgreSQL board (started by
// testkit/pgtest), real reaper-agent processes spawned by the Lite spawner
// (some left alive, some killed with SIGKILL, the agent alone or together
// with its task group), and the real plugin binaries, launched by the host's
// own plugin code from a parsed configuration and driven cycle by cycle by
// the host's maintenance loop on a fake clock. Only the clock is fake: the
// tests move it across the thresholds instead of sleeping, and they write the
// rows' timestamps themselves so that every threshold falls where the
// scenario needs it.
//
// The benchmarks measure what the reapers cost at scale: recovering 10,000
// dead Lite attempts, one idle pass over 100,000 healthy ones, and the price
// of running a reaper out of process. They seed their data only when run:
//
//	go test ./test/reapers -run '^$' -bench . -benchtime 5x
//
// Everything lives in the package's _test files; this file only documents
// them.
package reapers
