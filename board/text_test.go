package board_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// observer records what the board tells its Observer.
type observer struct {
	mu         sync.Mutex
	made       map[board.TextField]int
	refused    []string // "write run/task"
	deposed    []string // "write term"
	unrecorded []string // "write term: error"
}

func (o *observer) TextMadeSafe(f board.TextField) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.made == nil {
		o.made = map[board.TextField]int{}
	}
	o.made[f]++
}

func (o *observer) RowRefused(write string, a sdk.Attempt, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refused = append(o.refused, write+" "+a.RunID+"/"+a.TaskID)
}

func (o *observer) Deposed(write string, term int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deposed = append(o.deposed, fmt.Sprintf("%s %d", write, term))
}

func (o *observer) RefusalUnrecorded(write string, term int64, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unrecorded = append(o.unrecorded, fmt.Sprintf("%s %d: %v", write, term, err))
}

// fenced returns what the observer was told of the fence's refusals.
func (o *observer) fenced() (deposed, unrecorded []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.deposed), slices.Clone(o.unrecorded)
}

func (o *observer) counts() (map[board.TextField]int, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	made := map[board.TextField]int{}
	for k, v := range o.made {
		made[k] = v
	}
	return made, append([]string(nil), o.refused...)
}

// setupObserved is setup with an observer on the store and the writers.
func setupObserved(t *testing.T) (*bundle, *observer) {
	t.Helper()
	obs := &observer{}
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{Observer: obs})
	lease, ok, err := store.TryAcquire(context.Background(), "test-leader", leaseTTL, base.Add(-time.Minute))
	if err != nil || !ok {
		t.Fatalf("acquire leadership: ok=%v err=%v", ok, err)
	}
	return &bundle{pool: pool, store: store, w: lifecycle.New(pool, lifecycle.Options{Observer: obs}), term: lease.Term}, obs
}

// The poisons a tenant can put in its text: PostgreSQL refuses each in a
// text or jsonb column, so unmade-safe each would fail its whole batch.
const (
	nulText     = "exit\x00code"
	nulSafe     = "exit\uFFFDcode"
	invalidText = "bad\xff\xfebyte"
	invalidSafe = "bad\uFFFD\uFFFDbyte"
)

// outOfRange is a time PostgreSQL's timestamptz cannot hold (past 294276
// AD): a row carrying it is refused for its own data (22008), whatever its
// text.
var outOfRange = time.Date(294277, 6, 1, 0, 0, 0, 0, time.UTC)

func settlementOf(b *bundle, a sdk.Attempt, o sdk.Outcome, reason, message string) sdk.Settlement {
	return sdk.Settlement{Attempt: a, Outcome: o, FromStates: []string{sdk.StateRunning}, Reason: reason, Message: message,
		Term: b.term, At: base}
}

func safeAndBounded(t *testing.T, what, got string, bound int) {
	t.Helper()
	if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 || len(got) > bound {
		t.Fatalf("%s = %q (%d bytes): not safe within %d", what, got, len(got), bound)
	}
}

// TestTenantsTextIsMadeSafeAtTheBoardsEdge: a NUL or invalid UTF-8 in a
// reason, a message, a try log line, a decision's detail or evidence never
// fails the batch it comes in: every row of the batch is written, the
// poisoned one with its text made safe (read back and compared), and the
// observer hears of each field made safe.
func TestTenantsTextIsMadeSafeAtTheBoardsEdge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ASettleBatchWithAPoisonedReasonSettlesEveryRow", func(t *testing.T) {
		t.Parallel()
		b, obs := setupObserved(t)
		b.run(t, "r", "t1", "t2", "t3")
		as := []sdk.Attempt{first("r", "t1"), first("r", "t2"), first("r", "t3")}
		for _, a := range as {
			b.running(t, a, base.Add(-10*time.Minute), base.Add(-time.Minute))
		}
		ss := []sdk.Settlement{
			settlementOf(b, as[0], sdk.OutcomeSuccess, "", ""),
			settlementOf(b, as[1], sdk.OutcomeFailed, nulText, invalidText),
			settlementOf(b, as[2], sdk.OutcomeFailed, "exit_code", "exit_code: 3"),
		}
		res, err := b.store.Settle(ctx, ss)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if !r.Applied {
				t.Fatalf("settlement %d not applied: %+v", i, r)
			}
		}
		if ss[1].Reason != nulText {
			t.Fatal("the caller's settlement was changed")
		}
		ti := b.ti(t, "r", "t2")
		if ti.State != sdk.StateFailed || ti.FailureReason != nulSafe || ti.ErrorMessage != invalidSafe {
			t.Fatalf("poisoned row read back %s %q %q, want failed %q %q", ti.State, ti.FailureReason, ti.ErrorMessage, nulSafe, invalidSafe)
		}
		if ti := b.ti(t, "r", "t3"); ti.FailureReason != "exit_code" || ti.ErrorMessage != "exit_code: 3" {
			t.Fatalf("clean row read back %q %q", ti.FailureReason, ti.ErrorMessage)
		}
		if made, _ := obs.counts(); made[board.FieldReason] != 1 || made[board.FieldMessage] != 1 {
			t.Fatalf("observer heard %v, want one reason and one message made safe", made)
		}
	})

	t.Run("AMarkBatchWithAPoisonedMessageMarksEveryRow", func(t *testing.T) {
		t.Parallel()
		b, _ := setupObserved(t)
		b.run(t, "r", "t1", "t2")
		as := []sdk.Attempt{first("r", "t1"), first("r", "t2")}
		var marks []sdk.Mark
		for i, a := range as {
			b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
			marks = append(marks, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
				Reason: sdk.LabelAgentLost, Message: []string{"agent_lost: silent", "agent_lost: " + nulText}[i], Term: b.term, At: base})
		}
		res, err := b.store.Mark(ctx, marks)
		if err != nil || !res[0].Applied || !res[1].Applied {
			t.Fatalf("marks %+v %v, want both applied", res, err)
		}
		if ti := b.ti(t, "r", "t2"); ti.ErrorMessage != "agent_lost: "+nulSafe {
			t.Fatalf("poisoned mark's message read back %q", ti.ErrorMessage)
		}
	})

	t.Run("AnAppendLogBatchWithPoisonedLinesAppendsEveryLine", func(t *testing.T) {
		t.Parallel()
		b, obs := setupObserved(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		lines := []sdk.LogLine{{Attempt: a, At: base, Line: "one"}, {Attempt: a, At: base, Line: nulText},
			{Attempt: a, At: base, Line: invalidText}}
		if err := b.store.AppendLog(ctx, b.term, lines); err != nil {
			t.Fatal(err)
		}
		if err := b.w.AppendLog(ctx, lines); err != nil { // the writers' side (agents, the runner)
			t.Fatal(err)
		}
		got, err := b.store.AttemptLog(ctx, "r", "t")
		want := []string{"one", nulSafe, invalidSafe, "one", nulSafe, invalidSafe}
		if err != nil || len(got) != len(want) {
			t.Fatalf("log %+v %v", got, err)
		}
		for i, l := range got {
			if l.Line != want[i] {
				t.Fatalf("line %d read back %q, want %q", i, l.Line, want[i])
			}
		}
		if made, _ := obs.counts(); made[board.FieldLogLine] != 4 {
			t.Fatalf("observer heard %v, want 4 log lines made safe", made)
		}
	})

	t.Run("AnAuditBatchWithPoisonedEvidenceAndDetailRecordsEveryDecision", func(t *testing.T) {
		t.Parallel()
		b, _ := setupObserved(t)
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		ds := []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Detail: "clean", Evidence: map[string]string{"term": "7"}},
			{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive, Attempt: a, Detail: "said " + nulText,
				Evidence: map[string]string{"liveness_detail": nulText, "message": invalidText, "own\x00key": "v"}},
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Detail: invalidText},
		}
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "r", "t", 0)
		if err != nil || len(recs) != 3 {
			t.Fatalf("records %+v %v", recs, err)
		}
		ev := recs[1].Evidence
		if recs[1].Detail != "said "+nulSafe || recs[2].Detail != invalidSafe || recs[0].Detail != "clean" ||
			ev["liveness_detail"] != nulSafe || ev["message"] != invalidSafe || ev["own\uFFFDkey"] != "v" || len(ev) != 3 {
			t.Fatalf("decisions read back %q %q %q, evidence %q", recs[0].Detail, recs[1].Detail, recs[2].Detail, ev)
		}
	})

	t.Run("AReportThroughTheAttemptAPIsWriterIsMadeSafe", func(t *testing.T) {
		t.Parallel()
		b, _ := setupObserved(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		b.running(t, a, base.Add(-time.Minute), time.Time{})
		if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateFailed, Reason: nulText, Message: invalidText}, base); err != nil || stop {
			t.Fatalf("report: stop=%v err=%v", stop, err)
		}
		if ti := b.ti(t, "r", "t"); ti.FailureReason != nulSafe || ti.ErrorMessage != invalidSafe {
			t.Fatalf("report read back %q %q", ti.FailureReason, ti.ErrorMessage)
		}
	})

	t.Run("OverlongTextIsBoundedOnARuneBoundaryWithTheMarker", func(t *testing.T) {
		t.Parallel()
		b, _ := setupObserved(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		b.running(t, a, base.Add(-time.Minute), time.Time{})
		long := strings.Repeat("é", 100_000) // 200,000 bytes, two to a rune
		res, err := b.store.Settle(ctx, []sdk.Settlement{settlementOf(b, a, sdk.OutcomeFailed, long, long)})
		if err != nil || !res[0].Applied {
			t.Fatalf("settle %+v %v", res, err)
		}
		ti := b.ti(t, "r", "t")
		safeAndBounded(t, "reason", ti.FailureReason, sdk.MaxReasonBytes)
		safeAndBounded(t, "message", ti.ErrorMessage, sdk.MaxMessageBytes)
		for what, got := range map[string]string{"reason": ti.FailureReason, "message": ti.ErrorMessage} {
			if !strings.HasSuffix(got, sdk.TextCutMarker) || !strings.HasPrefix(long, strings.TrimSuffix(got, sdk.TextCutMarker)) {
				t.Fatalf("%s cut to %q...", what, got[:40])
			}
		}
		if err := b.store.AppendLog(ctx, b.term, []sdk.LogLine{{Attempt: a, At: base, Line: long}}); err != nil {
			t.Fatal(err)
		}
		lines, err := b.store.AttemptLog(ctx, "r", "t")
		if err != nil || len(lines) != 1 {
			t.Fatalf("log %d lines %v", len(lines), err)
		}
		safeAndBounded(t, "log line", lines[0].Line, sdk.MaxLogLineBytes)
		if err := b.store.RecordDecisions(ctx, b.term, base, []sdk.Decision{{Reaper: "agentlost", Label: sdk.LabelAgentLost,
			Attempt: a, Detail: long, Evidence: map[string]string{"message": long}}}); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "r", "t", 0)
		if err != nil || len(recs) != 1 {
			t.Fatalf("records %+v %v", recs, err)
		}
		safeAndBounded(t, "detail", recs[0].Detail, sdk.MaxDetailBytes)
		safeAndBounded(t, "evidence", recs[0].Evidence["message"], sdk.MaxEvidenceValueBytes)
	})

	t.Run("AFailedTeardownsLongErrorIsCutOnARuneNotInsideOne", func(t *testing.T) {
		// The owed teardown used to keep the first 2048 bytes of the
		// error: inside a rune, which PostgreSQL refuses.
		t.Parallel()
		b, _ := setupObserved(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		o, err := b.store.OweTeardown(ctx, board.TeardownFailure{RunID: "r", Attempt: &a, Reaper: "agentlost",
			Label: sdk.LabelAgentLostPodDeleteErr, Reason: sdk.LabelAgentLost, Error: "x" + strings.Repeat("é", 5000) + nulText,
			At: base, Term: b.term}, board.TeardownBackoff{Base: time.Second, Cap: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		safeAndBounded(t, "teardown error", o.LastError, board.MaxTeardownError)
		if !strings.HasSuffix(o.LastError, sdk.TextCutMarker) {
			t.Fatalf("teardown error cut without the marker: ...%q", o.LastError[len(o.LastError)-20:])
		}
	})
}

// TestABatchARowOfWhichPostgreSQLRefusesIsWrittenRowByRow: when PostgreSQL
// refuses a batch for one row's own data (here a time out of
// timestamptz's range, which no text rule can make safe), the rest of the
// batch is applied row by row, each under every guard of the batch
// statement; the refused row is answered row_refused, changes nothing, and
// the observer hears of it.
func TestABatchARowOfWhichPostgreSQLRefusesIsWrittenRowByRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Settle", func(t *testing.T) {
		t.Parallel()
		b, obs := setupObserved(t)
		b.run(t, "r", "t1", "t2", "t3", "t4")
		as := []sdk.Attempt{first("r", "t1"), first("r", "t2"), first("r", "t3"), first("r", "t4")}
		for _, a := range as {
			b.running(t, a, base.Add(-10*time.Minute), base.Add(-time.Minute))
		}
		before := b.ti(t, "r", "t2")
		ss := []sdk.Settlement{
			settlementOf(b, as[0], sdk.OutcomeSuccess, "", ""),
			settlementOf(b, as[1], sdk.OutcomeFailed, nulText, "refused"),
			settlementOf(b, as[2], sdk.OutcomeFailed, "exit_code", "exit_code: 3"),
			// its guard does not hold: another try is named
			settlementOf(b, sdk.Attempt{RunID: "r", TaskID: "t4", Try: 9}, sdk.OutcomeSuccess, "", ""),
		}
		ss[1].EndedAt = outOfRange
		res, err := b.store.Settle(ctx, ss)
		if err != nil {
			t.Fatal(err)
		}
		if !res[0].Applied || !res[2].Applied || res[1].Applied || res[1].NoopReason != sdk.NoopRowRefused ||
			res[3].Applied || res[3].NoopReason != sdk.NoopMovedOn {
			t.Fatalf("results %+v", res)
		}
		unchanged(t, before, b.ti(t, "r", "t2"))
		if b.ti(t, "r", "t1").State != sdk.StateSuccess || b.ti(t, "r", "t3").State != sdk.StateFailed ||
			b.ti(t, "r", "t4").State != sdk.StateRunning {
			t.Fatal("the rows around the refused one were not settled as their guards say")
		}
		if _, refused := obs.counts(); len(refused) != 1 || refused[0] != "settle r/t2" {
			t.Fatalf("observer heard of refused rows %v", refused)
		}
	})

	t.Run("Mark", func(t *testing.T) {
		t.Parallel()
		b, obs := setupObserved(t)
		b.run(t, "r", "t1", "t2")
		as := []sdk.Attempt{first("r", "t1"), first("r", "t2")}
		var marks []sdk.Mark
		for _, a := range as {
			b.running(t, a, base.Add(-10*time.Minute), base.Add(-5*time.Minute))
			marks = append(marks, sdk.Mark{Attempt: a, FromStates: []string{sdk.StateRunning}, Kind: sdk.MarkInfra,
				Reason: sdk.LabelAgentLost, Message: "agent_lost: silent", Term: b.term, At: base,
				HeartbeatBefore: base.Add(-time.Minute)})
		}
		marks[0].HeartbeatBefore = outOfRange
		before := b.ti(t, "r", "t1")
		res, err := b.store.Mark(ctx, marks)
		if err != nil || res[0].NoopReason != sdk.NoopRowRefused || !res[1].Applied {
			t.Fatalf("marks %+v %v", res, err)
		}
		unchanged(t, before, b.ti(t, "r", "t1"))
		if _, refused := obs.counts(); len(refused) != 1 || refused[0] != "mark r/t1" {
			t.Fatalf("observer heard of refused rows %v", refused)
		}
	})

	t.Run("AppendLog", func(t *testing.T) {
		t.Parallel()
		b, obs := setupObserved(t)
		b.run(t, "r", "t")
		a := first("r", "t")
		lines := []sdk.LogLine{{Attempt: a, At: base, Line: "one"}, {Attempt: a, At: outOfRange, Line: "refused"},
			{Attempt: a, At: base, Line: "three"}}
		if err := b.w.AppendLog(ctx, lines); err != nil {
			t.Fatal(err)
		}
		got, err := b.store.AttemptLog(ctx, "r", "t")
		if err != nil || len(got) != 2 || got[0].Line != "one" || got[1].Line != "three" {
			t.Fatalf("log %+v %v", got, err)
		}
		if _, refused := obs.counts(); len(refused) != 1 || refused[0] != "append log r/t" {
			t.Fatalf("observer heard of refused rows %v", refused)
		}
	})

	t.Run("RecordDecisions", func(t *testing.T) {
		// The audit's text is made safe as it is encoded; what can still
		// refuse one row is a check of the schema's (one added here).
		t.Parallel()
		b, obs := setupObserved(t)
		b.exec(t, `ALTER TABLE reap_decisions ADD CONSTRAINT no_poison CHECK (detail <> 'poison')`)
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		ds := []sdk.Decision{
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Detail: "one"},
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: sdk.Attempt{RunID: "r", TaskID: "u", Try: 1}, Detail: "poison"},
			{Reaper: "agentlost", Label: sdk.LabelAgentLost, Attempt: a, Detail: "three"},
		}
		if err := b.store.RecordDecisions(ctx, b.term, base, ds); err != nil {
			t.Fatal(err)
		}
		recs, err := b.store.DecisionsFor(ctx, "r", "", 0)
		if err != nil || len(recs) != 2 || recs[0].Detail != "one" || recs[1].Detail != "three" {
			t.Fatalf("records %+v %v", recs, err)
		}
		if _, refused := obs.counts(); len(refused) != 1 || refused[0] != "record decisions r/u" {
			t.Fatalf("observer heard of refused rows %v", refused)
		}
	})
}
