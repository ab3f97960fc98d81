// Package leader elects one reaping replica among any number sharing a
// board, through a lease row with a monotonically increasing term.
//
// States and transitions of one Elector:
//
//	            TryAcquire ok (term = T+1)
//	follower ─────────────────────────────► leader(T+1)
//	   ▲                                       │  Renew ok: trusted until
//	   │                                       │  attempt start + lease − margin
//	   │  Renew refused (another term holds)   │
//	   ├───────────────────────────────────────┤
//	   │  trust ran out (renewals failing,     │
//	   │  database unreachable)                │
//	   ├───────────────────────────────────────┤
//	   │  shutdown: Resign(T)                  │
//	   └───────────────────────────────────────┘
//
// Trust is local and conservative: the lease is counted from the moment the
// acquiring or renewing call started, not from when its answer arrived, and
// a safety margin is taken off, so a replica stops believing it leads before
// any other replica can take the lease over. Renewal and resignation only
// ever touch the replica's own term, so a deposed leader cannot extend or
// drop its successor's lease; and every board write of a pass carries the
// term, so a write from a deposed leader is a no-op at the database.
//
// The Lease interface is the seam for other electors (a Kubernetes Lease).
package leader
