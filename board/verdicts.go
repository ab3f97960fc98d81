package board

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// Shadow verdicts (migration 012): the verdict on a decision that said an
// attempt was lost, written beside it once the board knows what became of
// the attempt. The board reads the decisions still to score with the
// truth of their exact attempt, and writes verdicts guarded; judging is
// the host's (host/audit).

// Verdict is the verdict on one decision, as written.
type Verdict struct {
	Word     string            // one of sdk.Verdicts()
	At       time.Time         // when it was written (host clock)
	Term     int64             // the leadership term that wrote it
	Evidence map[string]string // what the scorer saw of the attempt
}

// unscoredSQL is the predicate of the decisions still to score, the
// partial index reap_decisions_unscored_idx's word for word (a test holds
// the two to the same text): a scored decision with no verdict yet.
func unscoredSQL(alias string) string {
	return alias + ".verdict IS NULL AND " + alias + ".scored"
}

// Scoring says which decisions the leader scores: by the reaper a
// decision is filed under, the kill and provisional labels that reaper's
// plugin declared (sdk.DeclaredKillLabels). The zero Scoring goes by the
// sdk's built-in lists (sdk.KillLabels, sdk.ProvisionalLabels) whatever
// the reaper: the in-tree reapers' declarations together.
type Scoring struct {
	reapers map[string]scoredLabels // nil: the built-in lists
}

type scoredLabels struct{ kill, provisional []string }

// NewScoring returns the scoring of the reapers configured, each by the
// name it is configured under and its plugin's Info. A decision of any
// other name (the gate, the host, a runner, the operator) is not scored.
func NewScoring(reapers map[string]sdk.Info) Scoring {
	sc := Scoring{reapers: map[string]scoredLabels{}}
	for name, info := range reapers {
		kill, provisional := sdk.DeclaredKillLabels(info)
		sc.reapers[name] = scoredLabels{kill: kill, provisional: provisional}
	}
	return sc
}

// Scored reports whether a decision is one the leader scores, which the
// audit writes beside it (reap_decisions.scored, migration 014): a dry-run
// decision that would have failed an attempt (a kill label), and an
// applied infra mark whose truth can still arrive (a provisional label):
// held for review, or made on kube, where the mark stays provisional and a
// durable SUCCESS may override it. A Lite mark is confirmed as it is made,
// on the substrate's positive word that the attempt is dead: nothing can
// come back to judge it by.
func (sc Scoring) Scored(d sdk.Decision) bool {
	kill, provisional := sdk.KillLabels(), sdk.ProvisionalLabels()
	if sc.reapers != nil {
		r := sc.reapers[d.Reaper]
		kill, provisional = r.kill, r.provisional
	}
	switch {
	case d.Attempt.TaskID == "":
		return false
	case d.DryRun:
		return slices.Contains(kill, d.Label)
	case d.Applied:
		return slices.Contains(provisional, d.Label) &&
			(d.Evidence["policy"] == "hold" || d.Evidence["edition"] == "kube")
	}
	return false
}

// Kill reports whether a decision failed an attempt, or would have in a
// dry run: its label is a kill label of the reaper it is filed under. The
// audit writes it beside the decision (reap_decisions.kill, migration 022),
// for reaperctl shadow.
func (sc Scoring) Kill(d sdk.Decision) bool {
	kill := sdk.KillLabels()
	if sc.reapers != nil {
		kill = sc.reapers[d.Reaper].kill
	}
	return slices.Contains(kill, d.Label)
}

// Scored is the zero Scoring's Scored: by the sdk's built-in lists.
func Scored(d sdk.Decision) bool { return Scoring{}.Scored(d) }

// UnscoredPredicate is the predicate of reap_decisions_unscored_idx as the
// board builds it, unqualified (for the test that compares it with the
// migration's).
func UnscoredPredicate() string { return strings.ReplaceAll(unscoredSQL("d"), "d.", "") }

// AttemptTruth is what the board shows of one attempt now: the task's row
// while the attempt is still its current one, its attempt_history row once
// a rail released it.
type AttemptTruth struct {
	Found    bool // the attempt is on the board (current or released)
	Released bool // a rail released it: its row is history, nothing more arrives
	State    string
	// Its stamps, zero when NULL.
	RunningAt, LastHeartbeatAt, EndedAt, InfraMarkedAt, InfraConfirmedAt, ReleasedAt time.Time
	LastFailureKind, FailureReason                                                   string
	RunState                                                                         string // "" when the run is gone
	RunEndedAt                                                                       time.Time
}

// ShadowDecision is a decision still to score, with the truth of its
// attempt.
type ShadowDecision struct {
	AuditRecord
	Truth AttemptTruth
}

// truthColumns are an attempt's columns, the same in task_instances and
// attempt_history.
const truthColumns = `state, running_at, last_heartbeat_at, ended_at, infra_marked_at, infra_confirmed_at,
        last_failure_kind, failure_reason`

// UnscoredDecisions returns up to limit decisions still to score whose id
// is above afterID, in id order (one range scan of
// reap_decisions_unscored_idx), each with the truth of its exact attempt
// (run, task, try and epoch) and of its run.
func (s *Store) UnscoredDecisions(ctx context.Context, afterID int64, limit int) ([]ShadowDecision, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, unscoredQuery(), afterID, pageLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("board: read unscored decisions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShadowDecision, error) {
		var (
			d                                                    ShadowDecision
			run, task                                            *string
			try, epoch                                           *int32
			released                                             *bool
			state, kind, reason, runState                        *string
			running, hb, ended, marked, confirmed, rel, runEnded *time.Time
			packed, evJSON                                       []byte
		)
		err := row.Scan(&d.ID, &d.At, &d.Term, &d.Reaper, &d.Label, &run, &task, &try, &epoch,
			&d.Applied, &d.DryRun, &d.Detail, &packed, &evJSON,
			&released, &state, &running, &hb, &ended, &marked, &confirmed, &kind, &reason, &rel, &runState, &runEnded)
		if err != nil {
			return d, err
		}
		d.Attempt = attemptOf(run, task, try, epoch)
		if d.Evidence, err = readEvidence(packed, evJSON); err != nil {
			return d, fmt.Errorf("decision %d: %w", d.ID, err)
		}
		t := &d.Truth
		t.Found = released != nil
		t.Released = released != nil && *released
		t.State, t.LastFailureKind, t.FailureReason, t.RunState = deref(state), deref(kind), deref(reason), deref(runState)
		t.RunningAt, t.LastHeartbeatAt, t.EndedAt = timeOrZero(running), timeOrZero(hb), timeOrZero(ended)
		t.InfraMarkedAt, t.InfraConfirmedAt, t.ReleasedAt = timeOrZero(marked), timeOrZero(confirmed), timeOrZero(rel)
		t.RunEndedAt = timeOrZero(runEnded)
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("board: read unscored decisions: %w", err)
	}
	return out, nil
}

// unscoredQuery reads the decisions still to score after $1, $2 at most,
// with the truth of their attempts: a range scan of the partial index,
// each attempt one primary-key lookup in task_instances, else in
// attempt_history.
func unscoredQuery() string {
	return `SELECT d.id, d.at, d.term, d.reaper, d.label, d.run_id, d.task_id, d.try_number,
        d.attempt_epoch, d.applied, d.dry_run, d.detail, d.evidence_packed, d.evidence,
        a.released, a.state, a.running_at, a.last_heartbeat_at, a.ended_at, a.infra_marked_at,
        a.infra_confirmed_at, a.last_failure_kind, a.failure_reason, a.released_at, r.state, r.ended_at
    FROM reap_decisions d
    LEFT JOIN LATERAL (
        SELECT false AS released, ` + truthColumns + `, NULL::timestamptz AS released_at
          FROM task_instances ti
         WHERE ti.run_id = d.run_id AND ti.task_id = d.task_id
           AND ti.try_number = d.try_number AND ti.attempt_epoch = d.attempt_epoch
        UNION ALL
        SELECT true, ` + truthColumns + `, released_at
          FROM attempt_history h
         WHERE h.run_id = d.run_id AND h.task_id = d.task_id
           AND h.try_number = d.try_number AND h.attempt_epoch = d.attempt_epoch
        LIMIT 1) a ON true
    LEFT JOIN runs r ON r.run_id = d.run_id
    WHERE ` + unscoredSQL("d") + ` AND d.id > $1
    ORDER BY d.id
    LIMIT $2`
}

// ScoredVerdict is a verdict to write on decision ID.
type ScoredVerdict struct {
	ID       int64
	Word     string
	Evidence map[string]string
}

// WriteVerdicts writes verdicts for the leader of term at now, all in one
// statement, each only on a decision still unscored: a decision already
// scored keeps its verdict. It returns the ids written, and ErrDeposed
// (nothing written) when term is not the leader row's or its lease has run
// out at now; the statement share-locks the leader row, as a mark does.
func (s *Store) WriteVerdicts(ctx context.Context, term int64, now time.Time, vs []ScoredVerdict) ([]int64, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	ids := make([]int64, len(vs))
	words := make([]string, len(vs))
	evs := make([]string, len(vs))
	known := setOf(sdk.Verdicts())
	for i, v := range vs {
		if !known[v.Word] {
			return nil, fmt.Errorf("board: write verdicts: %q is not a verdict", v.Word)
		}
		ev := safeEvidence(s.observer, v.Evidence)
		b, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("board: write verdicts: encode evidence: %w", err)
		}
		ids[i], words[i], evs[i] = v.ID, v.Word, string(b)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, fencedOwed+`
UPDATE reap_decisions d
   SET verdict = v.word, verdict_at = $3, verdict_term = $2, verdict_evidence = v.evidence::jsonb
  FROM unnest($4::bigint[], $5::text[], $6::text[]) AS v(id, word, evidence)
 WHERE d.id = v.id
   -- only a decision still unscored: a verdict is written once
   AND d.verdict IS NULL
   -- fenced: the leader row still holds the term, its lease unexpired
   AND `+fencedTerm+`
RETURNING d.id`, s.fenceKey(), term, now, ids, words, evs)
	if err != nil {
		return nil, fmt.Errorf("board: write verdicts: %w", err)
	}
	written, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("board: write verdicts: %w", err)
	}
	if len(written) == 0 {
		if err := s.leads(ctx, "write verdicts", term, now); err != nil {
			return nil, fmt.Errorf("board: write verdicts: %w", err)
		}
	}
	return written, nil
}

func attemptOf(run, task *string, try, epoch *int32) sdk.Attempt {
	a := sdk.Attempt{RunID: deref(run), TaskID: deref(task)}
	if try != nil {
		a.Try = *try
	}
	if epoch != nil {
		a.Epoch = *epoch
	}
	return a
}

// ShadowGroup is the decisions of one reaper under one label about one
// attempt in a window, by verdict: what reaperctl shadow counts, and names.
type ShadowGroup struct {
	Reaper, Label string
	sdk.Attempt
	// Scored: the decisions are scored (a dry run, a hold, a provisional
	// kube mark); the others are applied marks, counted as the live path's.
	Scored  bool
	DryRun  bool
	Applied bool
	Verdict string // "" while unscored (and for a decision never scored)
	Count   int
	// The first and last decision of the group.
	FirstID, LastID int64
	FirstAt, LastAt time.Time
}

// ShadowGroupsMax bounds what ShadowDecisions returns.
const ShadowGroupsMax = 100_000

// ShadowDecisions returns the decisions that failed, or would have failed,
// an attempt (reap_decisions.kill: a kill label its reaper declared),
// dry-run or applied, made at or after since,
// grouped by reaper, label, attempt, dry run and verdict, ordered by
// reaper, label and first decision; truncated says ShadowGroupsMax left
// some out. It reads the window through reap_decisions_at_idx: a query for
// an operator, not for the cycle.
func (s *Store) ShadowDecisions(ctx context.Context, since time.Time) (groups []ShadowGroup, truncated bool, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT d.reaper, d.label, d.run_id, d.task_id, d.try_number, d.attempt_epoch,
        d.scored, d.dry_run, d.applied, coalesce(d.verdict, ''),
        count(*), min(d.id), max(d.id), min(d.at), max(d.at)
    FROM reap_decisions d
    WHERE d.at >= $1 AND d.task_id IS NOT NULL AND d.kill
      AND (d.dry_run OR d.applied)
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
    ORDER BY 1, 2, 12
    LIMIT $2`, since, ShadowGroupsMax+1)
	if err != nil {
		return nil, false, fmt.Errorf("board: read shadow decisions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShadowGroup, error) {
		var g ShadowGroup
		err := row.Scan(&g.Reaper, &g.Label, &g.RunID, &g.TaskID, &g.Try, &g.Epoch, &g.Scored, &g.DryRun, &g.Applied,
			&g.Verdict, &g.Count, &g.FirstID, &g.LastID, &g.FirstAt, &g.LastAt)
		return g, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("board: read shadow decisions: %w", err)
	}
	if len(out) > ShadowGroupsMax {
		return out[:ShadowGroupsMax], true, nil
	}
	return out, false, nil
}
