// Package history is a fault history and its checker: a file of JSON lines
// that records, for one run of a fault suite or the soak, every write the
// board was asked to make under a leadership term, every execution of a
// task the agents started and ended, the faults thrown, and the board's
// task rows as they stood at the end; and Check, which reads such a file
// and says whether the run kept its promises. The point is that a run is
// judged by what happened, written down as it happened, and that anyone
// can rerun the judgement on the file (cmd/historycheck) without a
// database, a cluster or the logs.
//
// # The file
//
// One Event per line, in the order the recorders wrote them (which need
// not be time order: several processes may append to one file). Every
// event has a time (RFC 3339 with nanoseconds) and a kind:
//
//	write       a guarded write the board applied or refused
//	exec_start  an execution of a task began (from an agent's journal or ledger)
//	exec_end    an execution ended, reported or established (killed)
//	final       a task's row as read from the board after the run
//	fault       a fault the nemesis threw or healed (counted, not judged)
//
// A write carries:
//
//	op       what was written: mark, confirm, override, settle, sightings,
//	         report, heartbeat, retry, replace, clear, verdict, prune, ...
//	term     the leadership term it was fenced by; absent (0) for a write
//	         no term fences, such as an agent's own report
//	holder   who held that term by its own account (required with a term)
//	attempt  the attempt the write was guarded on: run_id, task_id, try,
//	         epoch; absent for a write that is about no task (a prune)
//	outcome  "applied", or the board's word for why it refused ("deposed"
//	         for the fence, "moved_on", "not_found", ...)
//	state    the state the write set on the attempt (or would have set):
//	         success, failed, running, ...; absent when it sets none
//	next     for a write that begins a new execution (retry, re-place,
//	         clear, ...), the attempt the row holds after it; state is then
//	         the new attempt's state
//	since    when the write was sent, if known; time is when its answer
//	         came back. The write took effect somewhere in between.
//	fence    for a write the fence refused (outcome "deposed"), what it
//	         met, if known: the leader row's term, holder and lease
//	         expiry, and the write's own time the lease was compared with
//
// The write "acquire" (OpAcquire), applied, is the leader row beginning a
// term, under that term, by its holder: the history's leader history.
//
// An execution start carries attempt (the task and the try and epoch it
// ran as) and exec, an identifier unique to that execution (a pod's UID, a
// process's pid with its start time). Its end carries the same exec (and
// may repeat the attempt) and an outcome: the execution's own ("success", "failed", "exit 3", ...) or
// "killed" when it ended without a word of its own and the recorder
// established that it ended (the process reaped, the pod gone, the
// container terminated): the end's time is when that was established.
//
// A final event carries attempt and state: the task's row after the run.
//
// A fault event may carry lost_from: the board lost every write it had
// applied from lost_from to the event's time (its primary killed then, and
// a standby that had stopped receiving those writes promoted: an
// asynchronous failover). The history is the promoted board's account, so
// the lost writes are not in it.
//
// # What Check proves
//
// Times are compared as the recorders wrote them, which assumes they share
// a clock (one machine). An event is known to follow a write only if it
// was sent after that write's answer came back: for a write with a since,
// since is compared, else its time. Equal times order nothing: two events
// at the same instant are never taken as one after the other by the rules
// that need an order between writes (one writer, a stale attempt). Where
// the rules walk the history in order, events are sorted by time, and
// events with the same time keep their order in the file.
//
// Applied writes are what break the rules on writes: a refused write is the
// fence (or a guard) doing its job, and is counted; but the fence must
// refuse only what is stale.
//
// No rightful holder refused (RuleRightfulRefused): a write the fence
// refused must not be of the term and holder the leader history shows
// leading at the refusal's time (the last acquisition before it; one at
// the same instant orders nothing, and the refusal is not judged), unless
// its fence shows the writer's own lease run out at the write's time, or
// its term resigned, which acquisitions do not record. A history with no
// acquisition has no leader history; its refusals are only counted.
//
// One writer (RuleStaleTerm, RuleTermTwice): once a term's first applied
// write has come back, no write under an older term may be applied that
// was sent after it; and one term is held by one holder: applied writes
// of one term from two holders mean the term was handed out twice (a
// failover that lost the increment).
//
// One execution (RuleOverlap): no two executions of one task (run_id,
// task_id), of any try or epoch, overlap in time. An execution with no
// end is taken to run to the end of time: it overlaps every later
// execution of its task. Touching is not overlapping: one that ends at
// the instant the next begins is fine.
//
// No outcome lost or overwritten (RuleOverwritten, RuleLost): once an
// applied write settled an attempt (success, failed, upstream_failed,
// skipped), no later applied write may set that attempt (same try and
// epoch) to another state, with two exceptions that are the board's own
// ways of correcting a failure: OpOverride may turn failed into success
// (an infra mark over an attempt that left a durable success), and
// OpVerdict (an operator's mark) may turn failed into success or failed.
// OpConfirm keeps failed failed, as any write may rewrite the state an
// attempt already has. Moving a settled attempt on to a new one (a write
// with next) is the retry and re-place rails' business for a failure; a
// success, a skip or an upstream failure is moved on only by OpClear. An
// applied write on an attempt the task had been moved past (sent after the
// write that moved it on came back) is an overwrite too. At the end, the
// final row must agree with the last state applied to its attempt once
// that attempt was settled, and must not stand at an attempt older than
// one an applied write reached (the board rolled back). A write the board
// acknowledged and then lost, a standby promoted without it, shows here.
//
// Every attempt ended (RuleNotTerminal, RuleNoFinal, RuleUnended): every
// task the history names has a final row, that row is settled, and every
// execution that started has an end.
//
// A lost window (lost.go) excuses exactly what the board's loss explains,
// and the verdict counts it (excused_by_lost_window): a task that no write
// names and all of whose executions started after a window opened and
// before the board applied anything after it has no final row (its run was
// submitted on the lost primary). Nothing else is excused: the rules on
// writes judge what the promoted board applied, in full (a term number it
// hands out again is still held twice if two holders' writes apply), and
// two executions of one task at once are never excused.
//
// An event Check cannot read as evidence (RuleMalformed: a missing time,
// an unknown kind, a write with a term and no holder, an end with no start,
// ...) is a violation too, and is left out of the other rules: a history
// that does not say what happened proves nothing.
package history
