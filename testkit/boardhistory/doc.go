// Package boardhistory records, in the board's own database, every write
// the board takes, and turns that record into a fault history (package
// testkit/history) for a harness to judge: the soak and both editions'
// fault suites share it.
//
// Install adds triggers to a migrated board. From then on the database
// keeps, each with its own clock (clock_timestamp()):
//
//   - every change of a task instance's state, try or epoch, with the
//     leader row's term and holder then, the writing connection's
//     application_name (reaperd names its connections by its holder), and
//     whether the writing transaction had share-locked the leader row
//     (every write fenced by a term does, to read its fence; nothing else
//     does);
//   - every change of a run's state, the same way;
//   - every term the leader row began, and its holder;
//   - every heartbeat that landed.
//
// Collect reads these back (Board); ReadFinals reads every task's row as
// it stands. Record turns the board's rows, the final rows and what the
// harness itself knows (the executions it watched, as Execution, and the
// faults it threw, as Fault) into history events, and Judge writes them to
// a history file, reads it back and checks it. How to tell an execution's
// start and end, and when one killed without a word was gone, is each
// harness's business: only it watched them.
//
// A write the fence refused leaves no row the triggers see (it changed
// nothing); the board itself keeps it, in fence_refusals (migration 20),
// and Collect reads those too (Board.Refusals), so the history holds the
// writes the fence refused beside those that applied, each with what the
// fence met: the checker proves each refusal stale by the leader row's
// history of terms (history.RuleRightfulRefused).
package boardhistory
