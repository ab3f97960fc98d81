// Package board is the scheduler's metadatabase as far as reaping needs it,
// on PostgreSQL through pgx. It is the only package of the project that holds
// a database connection.
//
// It has three parts:
//
//   - The schema, as embedded numbered migrations (Migrate, CheckSchema).
//   - Store, the reapers' side: it implements sdk.Board (typed candidate
//     listings with keyset paging, guarded and term-fenced marks, the atomic
//     orphan-run reap, try-log appends) and adds what only the host uses:
//     the decision audit, the leadership lease and plain reads of rows.
//   - Package lifecycle (board/lifecycle), the writers' side: the guarded
//     transitions a scheduler, an agent or a test drives a task instance
//     through, and the rails that start a new execution.
//
// Every write names the attempt it applies to (run, task, try, epoch) and
// the states it may move from; a write whose attempt moved on changes nothing
// and says so. Every write of the reapers' side also carries the leadership
// term and is refused when that term is no longer current (fencing). Times
// are always the caller's: the database clock is never read for a decision.
//
// The leadership lease is one row of the leader table per name. Its states,
// judged against the caller's clock:
//
//	free ──TryAcquire──▶ held(term+1, holder, expires_at)
//	held ──Renew(term, holder), before expiry──▶ held(term, holder, later expiry)
//	held ──Resign(term, holder)──▶ free (holder and expiry cleared; the term stays)
//	held ──expiry passes──▶ expired: TryAcquire by anyone ──▶ held(term+1, ...)
//
// The term only ever grows, so a term names one tenure. A mark applies only
// while its term is the row's term and the lease has not expired at the
// mark's time. Marks share-lock the row and a takeover updates it, so a
// takeover waits for the marks in flight, and a mark that waited for a
// takeover sees the new term and is refused.
package board
