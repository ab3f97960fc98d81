// Package sdktest is a test harness for reaper plugin authors. It holds
// three parts that together let a reaper's policy be table-tested in-process
// in a few lines, with no database, no processes and no sleeps:
//
//   - Board: an in-memory sdk.Board with the same guards as the Postgres
//     board (marks pinned to the attempt and its source states, the
//     heartbeat guards, fencing on the leadership term; keyset listings with
//     the threshold applied before the limit; the atomic re-check of a run
//     reap; the reconciler's writes), factories to put rows on it, setters
//     to move rows, and hooks to move them between a listing and a write.
//     It passes the same conformance suite as the Postgres board
//     (sdk/sdktest/boardtest).
//   - Executions: a scripted sdk.Executions that answers liveness per
//     attempt, reports scripted stop and teardown outcomes, and records
//     every call.
//   - Harness: both of the above plus a fake clock and the default timing
//     ladder, which builds each sdk.Pass and carries the reaper's opaque
//     state from one pass to the next.
//
// A typical test:
//
//	h := sdktest.New(ladder.EditionLite)
//	a := h.Running("run-1", "extract", 10*time.Minute, 2*time.Minute)
//	h.Exec.Dead(a)
//	ds, err := h.Reap(ctx, agentlost.New(nil))
//	// ds.Label(a) == sdk.LabelAgentLost, h.Board.Row(a).State == sdk.StateFailed
package sdktest
