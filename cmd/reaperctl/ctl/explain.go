package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// evidenceOrder is the order evidence is told in: what was measured, what
// the substrate said, what it was judged against; the rest follows by name.
// The keys are the reapers' (sdk/reap).
var evidenceOrder = []string{
	"state", "executor", "heartbeat_age", "running_age", "queued_age", "activity_age",
	"liveness", "agent", "group", "orphan", "pending", "liveness_live", "liveness_detail",
	"threshold", "ceiling", "signal", "mark", "policy", "noop_reason",
	"operator", "verdict",
}

// ExplainLimitDefault is how many decisions explain tells unless -limit says.
const ExplainLimitDefault = 100

type explainJSON struct {
	TaskInstance attemptJSON    `json:"task_instance"`
	Run          runBriefJSON   `json:"run"`
	Decisions    []decisionJSON `json:"decisions"`
	// OlderOmitted is true when -limit left older decisions out.
	OlderOmitted bool          `json:"older_omitted"`
	Log          []logLineJSON `json:"log"`
	// OwedTeardowns are the teardowns of the task's attempts (or of its
	// run) that did not complete and are still being retried.
	OwedTeardowns []owedJSON `json:"owed_teardowns"`
}

type owedJSON struct {
	TaskID        string    `json:"task_id,omitempty"` // empty: the run's teardown
	Try           *int32    `json:"try_number,omitempty"`
	Epoch         *int32    `json:"attempt_epoch,omitempty"`
	PodUID        string    `json:"pod_uid,omitempty"`
	Reaper        string    `json:"reaper"`
	Label         string    `json:"label"`
	Reason        string    `json:"reason"`
	Tries         int       `json:"tries"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	LastTriedAt   time.Time `json:"last_tried_at"`
	LastError     string    `json:"last_error"`
	NextTryAt     time.Time `json:"next_try_at"`
}

func owedOf(o board.OwedTeardown) owedJSON {
	j := owedJSON{PodUID: o.PodUID, Reaper: o.Reaper, Label: o.Label, Reason: o.Reason, Tries: o.Tries,
		FirstFailedAt: o.FirstFailedAt, LastTriedAt: o.LastTriedAt, LastError: o.LastError, NextTryAt: o.NextTryAt}
	if a := o.Attempt; a != nil {
		try, epoch := a.Try, a.Epoch
		j.TaskID, j.Try, j.Epoch = a.TaskID, &try, &epoch
	}
	return j
}

func (c CLI) explain(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	limit := fs.Int("limit", ExplainLimitDefault, "tell at most the newest `N` decisions (0: all)")
	pos, err := inv.parse(2, 2)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("-limit %d: must not be negative", *limit)
	}
	runID, taskID := pos[0], pos[1]

	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	now := c.now()

	run, ti, err := findTask(ctx, s, runID, taskID)
	if err != nil {
		return err
	}
	ask := 0
	if *limit > 0 {
		ask = *limit + 1 // one more, to know whether older ones were left out
	}
	recs, err := s.store.DecisionsFor(ctx, runID, taskID, ask)
	if err != nil {
		return err
	}
	older := *limit > 0 && len(recs) > *limit
	if older {
		recs = recs[len(recs)-*limit:]
	}
	// The audit is in the order it was written; the story is told in the
	// order the passes judged (replicas' writes may interleave).
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].At.Before(recs[j].At) })
	lines, err := s.store.AttemptLog(ctx, runID, taskID)
	if err != nil {
		return err
	}
	owed, err := s.store.OwedTeardownsFor(ctx, runID, taskID)
	if err != nil {
		return err
	}

	if inv.json {
		doc := explainJSON{TaskInstance: attemptOf(ti), Run: runBriefOf(run),
			Decisions: []decisionJSON{}, OlderOmitted: older, Log: []logLineJSON{}, OwedTeardowns: []owedJSON{}}
		for _, o := range owed {
			doc.OwedTeardowns = append(doc.OwedTeardowns, owedOf(o))
		}
		for _, r := range recs {
			doc.Decisions = append(doc.Decisions, decisionOf(r))
		}
		for _, l := range lines {
			doc.Log = append(doc.Log, logLineOf(l))
		}
		return writeJSON(inv.stdout, doc)
	}
	w := inv.stdout
	tellRow(w, now, run, ti)
	fmt.Fprintln(w)
	if len(owed) > 0 {
		tellOwed(w, now, ti, owed)
		fmt.Fprintln(w)
	}
	tellDecisions(w, now, ti, recs)
	if older {
		fmt.Fprintf(w, "\n(older decisions left out: raise -limit, or -limit 0 for all)\n")
	}
	fmt.Fprintln(w)
	tellLog(w, lines)
	return nil
}

// tellRow tells where the task instance stands now.
func tellRow(w io.Writer, now time.Time, run board.Run, ti board.TaskInstance) {
	head := fmt.Sprintf("%s/%s is %s", ti.RunID, ti.TaskID, ti.State)
	switch {
	case ti.LastFailureKind == sdk.FailureInfra:
		head += ", an infra failure"
	case ti.LastFailureKind == sdk.FailureTask:
		head += ", a task failure"
	}
	if ti.FailureReason != "" {
		head += " (" + ti.FailureReason + ")"
	}
	if !ti.HeldAt.IsZero() {
		head += fmt.Sprintf(", held for review for %s", age(now, ti.HeldAt))
	}
	operator := strings.HasPrefix(ti.ErrorMessage, sdk.LabelOperatorMark+":")
	if operator {
		head += ", an operator's verdict"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintf(w, "  run %s (dag %s) is %s\n", run.RunID, run.DagID, run.State)

	what := fmt.Sprintf("  current attempt: try %d epoch %d on %s", ti.Try, ti.Epoch, ti.Executor)
	if ti.Command != "" {
		what += ", command " + clip(ti.Command, 80)
	}
	if ti.ExecutionTimeout > 0 {
		what += ", timeout " + human(ti.ExecutionTimeout)
	}
	fmt.Fprintln(w, what)

	var times []string
	for _, st := range []struct {
		name string
		at   time.Time
	}{
		{"released", ti.ReleasedAt}, {"queued", ti.QueuedAt}, {"running", ti.RunningAt},
		{"last heartbeat", ti.LastHeartbeatAt}, {"ended", ti.EndedAt},
		{"infra-marked", ti.InfraMarkedAt}, {"confirmed", ti.InfraConfirmedAt},
	} {
		if !st.at.IsZero() {
			times = append(times, fmt.Sprintf("%s %s ago", st.name, age(now, st.at)))
		}
	}
	if ti.State == sdk.StateRunning && ti.LastHeartbeatAt.IsZero() {
		times = append(times, "never heartbeated")
	}
	if len(times) > 0 {
		fmt.Fprintln(w, "  "+strings.Join(times, ", "))
	}
	if line := credentialLine(now, ti); line != "" {
		fmt.Fprintln(w, "  "+line)
	}
	fmt.Fprintf(w, "  retries left %d of %d, infra re-places used %d of %d\n",
		ti.Retries, ti.MaxRetries, ti.InfraUsed, ti.InfraBudget)
	if ti.ErrorMessage != "" {
		fmt.Fprintln(w, "  error: "+oneLine(ti.ErrorMessage))
	}
	if !ti.HeldAt.IsZero() {
		fmt.Fprintf(w, "  no rail re-places it until released: reaperctl release %s %s\n", ti.RunID, ti.TaskID)
	}
	if operator {
		fmt.Fprintln(w, "  no rail, re-place or override touches a verdict; a clear runs the task again")
	}
}

// tellOwed tells the teardowns still owed for the task instance or its
// run: a reaped execution that may still be running, and why it is not
// stopped yet.
func tellOwed(w io.Writer, now time.Time, ti board.TaskInstance, owed []board.OwedTeardown) {
	for _, o := range owed {
		subject := "of the run (every pod of it)"
		if a := o.Attempt; a != nil {
			subject = fmt.Sprintf("of try %d epoch %d", a.Try, a.Epoch)
			if a.Try != ti.Try || a.Epoch != ti.Epoch {
				subject += " (an earlier attempt)"
			}
		}
		next := "due now"
		if o.NextTryAt.After(now) {
			next = "next try in " + age(o.NextTryAt, now)
		}
		fmt.Fprintf(w, "teardown owed %s since %s ago (%s, reaped as %s): %s, %s\n", subject, age(now, o.FirstFailedAt),
			o.Reaper, o.Reason, failedTries(o.Tries), next)
		if o.PodUID != "" {
			fmt.Fprintf(w, "  pod uid %s\n", o.PodUID)
		}
		fmt.Fprintf(w, "  last error (%s, %s ago): %s\n", o.Label, age(now, o.LastTriedAt), clip(oneLine(o.LastError), 300))
	}
}

func failedTries(n int) string {
	if n == 1 {
		return "1 failed try"
	}
	return fmt.Sprintf("%d failed tries", n)
}

// tellDecisions tells every decision about the task instance (and about its
// run), oldest first.
func tellDecisions(w io.Writer, now time.Time, ti board.TaskInstance, recs []board.AuditRecord) {
	if len(recs) == 0 {
		fmt.Fprintln(w, "no reaper has judged it (no decisions in the audit)")
		return
	}
	counts := map[string]int{}
	for _, r := range recs {
		counts[outcome(r)]++
	}
	var sum []string
	for _, o := range []string{"applied", "deferred", "no-op", "dry-run"} {
		if counts[o] > 0 {
			sum = append(sum, fmt.Sprintf("%d %s", counts[o], o))
		}
	}
	fmt.Fprintf(w, "%s, oldest first (%s):\n", plural(len(recs), "decision"), strings.Join(sum, ", "))
	for _, r := range recs {
		fmt.Fprintln(w)
		who := r.Reaper
		if who == "" {
			who = "the host"
		}
		subject := fmt.Sprintf("try %d epoch %d", r.Attempt.Try, r.Attempt.Epoch)
		switch {
		case r.Attempt.TaskID == "":
			subject = "the run"
		case r.Attempt.Try != ti.Try || r.Attempt.Epoch != ti.Epoch:
			subject += " (an earlier attempt)"
		}
		if r.Label == sdk.LabelOperatorMark {
			fmt.Fprintf(w, "  %s (%s ago): operator %s marked %s %s\n", stamp(r.At), age(now, r.At),
				r.Evidence["operator"], subject, r.Evidence["verdict"])
		} else {
			by := ""
			if r.Holder != "" {
				by = " by " + r.Holder
			}
			fmt.Fprintf(w, "  %s (%s ago), term %d%s: %s judged %s\n", stamp(r.At), age(now, r.At), r.Term, by, who, subject)
		}
		fmt.Fprintf(w, "    %s: %s\n", r.Label, outcomeWords(r))
		if r.Detail != "" {
			fmt.Fprintf(w, "    %s\n", oneLine(r.Detail))
		}
		if ev := evidenceLine(r.Evidence); ev != "" {
			fmt.Fprintf(w, "    saw %s\n", ev)
		}
		if line := verdictLine(now, r.Verdict); line != "" {
			fmt.Fprintf(w, "    %s\n", line)
		} else if r.Scored {
			fmt.Fprintln(w, "    verdict: not yet, waiting for what the attempt does next")
		}
	}
}

// verdictLine tells the shadow verdict on a decision: what the attempt did
// after it, and when the verdict was written. "" while unscored.
func verdictLine(now time.Time, v board.Verdict) string {
	if v.Word == "" {
		return ""
	}
	ev := v.Evidence
	line := "verdict: " + v.Word
	var why []string
	if by := ev["by"]; by != "" {
		why = append(why, "by "+verdictBy(by))
	}
	if after := ev["after"]; after != "" {
		why = append(why, after+" after the decision")
	}
	if waited := ev["waited"]; waited != "" {
		why = append(why, "no truth in "+waited)
	}
	if len(why) > 0 {
		line += " (" + strings.Join(why, ", ") + ")"
	}
	return line + fmt.Sprintf(", scored %s ago, term %d", age(now, v.At), v.Term)
}

// verdictBy says in words what settled a verdict (the scorer's "by").
func verdictBy(by string) string {
	switch by {
	case "heartbeat":
		return "a heartbeat"
	case "running":
		return "a running report"
	case "success":
		return "a success"
	case "outcome":
		return "an outcome it reported"
	case "override":
		return "a durable SUCCESS over the mark"
	case "mark":
		return "an infra failure from another path"
	case "ceiling":
		return "the credential ceiling"
	case "confirmed":
		return "the mark's confirmation"
	case "run_failed":
		return "its run failing"
	case "released":
		return "a rail releasing it with no truth"
	case "horizon":
		return "the horizon passing"
	case "gone":
		return "the attempt being gone"
	}
	return by
}

// outcome classifies a decision: applied, dry-run, no-op (a write that found
// the row moved on) or deferred (judged and left alone).
func outcome(r board.AuditRecord) string {
	switch {
	case r.DryRun:
		return "dry-run"
	case r.Applied:
		return "applied"
	case r.Evidence["noop_reason"] != "":
		return "no-op"
	}
	return "deferred"
}

func outcomeWords(r board.AuditRecord) string {
	switch outcome(r) {
	case "dry-run":
		return "dry-run, nothing written"
	case "applied":
		return "applied"
	case "no-op":
		return "not applied: " + r.Evidence["noop_reason"]
	}
	return "deferred, nothing written"
}

// evidenceLine renders evidence as key=value pairs in a telling order.
func evidenceLine(ev map[string]string) string {
	if len(ev) == 0 {
		return ""
	}
	var parts []string
	seen := map[string]bool{}
	for _, k := range evidenceOrder {
		seen[k] = true
		if v, ok := ev[k]; ok && v != "" {
			parts = append(parts, k+"="+oneLine(v))
		}
	}
	var rest []string
	for k := range ev {
		if !seen[k] && ev[k] != "" {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		parts = append(parts, k+"="+oneLine(ev[k]))
	}
	return strings.Join(parts, " ")
}

// tellLog prints the try log, every attempt.
func tellLog(w io.Writer, lines []sdk.LogLine) {
	if len(lines) == 0 {
		fmt.Fprintln(w, "try log: empty")
		return
	}
	fmt.Fprintf(w, "try log (%s):\n", plural(len(lines), "line"))
	t := newTable(w, "  AT", "TRY", "EPOCH", "LINE")
	for _, l := range lines {
		t.row("  "+stamp(l.At), fmt.Sprint(l.Try), fmt.Sprint(l.Epoch), oneLine(l.Line))
	}
	_ = t.flush()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// findTask reads a run and one of its task instances, saying which of the
// two does not exist.
func findTask(ctx context.Context, s *session, runID, taskID string) (board.Run, board.TaskInstance, error) {
	run, err := s.store.Run(ctx, runID)
	if errors.Is(err, board.ErrNotFound) {
		return board.Run{}, board.TaskInstance{}, fmt.Errorf("no run %q", runID)
	}
	if err != nil {
		return board.Run{}, board.TaskInstance{}, err
	}
	ti, err := s.store.TaskInstance(ctx, runID, taskID)
	if errors.Is(err, board.ErrNotFound) {
		return board.Run{}, board.TaskInstance{}, fmt.Errorf("run %q has no task %q", runID, taskID)
	}
	if err != nil {
		return board.Run{}, board.TaskInstance{}, err
	}
	return run, ti, nil
}

// credentialLine tells the attempt's credential: when it was minted, when a
// heartbeat last renewed it, and whether the ceiling stopped its renewal.
// "" when the attempt holds none (not dispatched through the attempt API).
func credentialLine(now time.Time, ti board.TaskInstance) string {
	if ti.CredentialMintedAt.IsZero() {
		return ""
	}
	parts := []string{fmt.Sprintf("credential minted %s ago", age(now, ti.CredentialMintedAt))}
	if ti.CredentialRenewedAt.IsZero() {
		parts = append(parts, "never renewed")
	} else {
		parts = append(parts, fmt.Sprintf("last renewed %s ago", age(now, ti.CredentialRenewedAt)))
	}
	if !ti.CredentialCappedAt.IsZero() {
		parts = append(parts, fmt.Sprintf("renewal stopped at the ceiling (auth.max_attempt_credential_lifetime) %s ago",
			age(now, ti.CredentialCappedAt)))
	}
	return strings.Join(parts, ", ")
}
