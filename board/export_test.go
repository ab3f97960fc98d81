package board

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// CandidateSQL exposes the listing statement to the tests.
var CandidateSQL = candidateSQL

// ListingSettings are the planner settings a listing runs under.
const ListingSettings = listingSettings

// MarkSQL is the mark statement, for EXPLAIN.
const MarkSQL = markSQL

// OwedOfSQL is OwedTeardownOf's statement, for EXPLAIN.
const OwedOfSQL = owedOfSQL

// ExplainCandidates explains the listing of q exactly as ListCandidates runs
// it, and returns the plan as JSON.
func (s *Store) ExplainCandidates(ctx context.Context, q sdk.CandidateQuery) (string, error) {
	sql, args, _, err := candidateSQL(q)
	if err != nil {
		return "", err
	}
	var plan string
	err = s.listing(ctx, "EXPLAIN (FORMAT JSON) "+sql, args, func(rows pgx.Rows) error {
		var err error
		plan, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		return err
	})
	return plan, err
}

// ExplainAnalyzeCandidates runs the listing of q as ListCandidates runs it,
// under EXPLAIN ANALYZE, and returns the plan as JSON.
func (s *Store) ExplainAnalyzeCandidates(ctx context.Context, q sdk.CandidateQuery) (string, error) {
	sql, args, _, err := candidateSQL(q)
	if err != nil {
		return "", err
	}
	var plan string
	err = s.listing(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args, func(rows pgx.Rows) error {
		var err error
		plan, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		return err
	})
	return plan, err
}

// OrphanRunsSQL is the statement and arguments of ListOrphanRuns for q.
func OrphanRunsSQL(q sdk.RunQuery) (string, []any) {
	sql, args, _ := orphanRunsSQL(q)
	return sql, args
}

// UnscoredQuery is the statement UnscoredDecisions runs, for EXPLAIN.
var UnscoredQuery = unscoredQuery

// ReplaySQL is each rung's history read with n thresholds, by the rung's
// name, for EXPLAIN: its parameters are the window's start, the quantiles'
// fractions and the n thresholds in microseconds.
func ReplaySQL(n int) map[string]string {
	tail := replayTail(n, ReplayListDefault)
	return map[string]string{
		"agent_lost":         attemptsObs(agentLostObsSQL) + tail,
		"dispatch_lost":      attemptsObs(dispatchLostObsSQL) + tail,
		"credential_ceiling": attemptsObs(ceilingObsSQL) + tail,
		"orphan_run":         orphanRunSQL + tail,
		"pod_lost_floor":     attemptsObsWith(podLostFloorColumns, podLostFloorObsSQL) + tail,
	}
}

// PackEvidence is ev in the audit's packed form (migration 014), its
// strings as they are: as a row written before the board made evidence
// safe holds them.
func PackEvidence(ev map[string]string) []byte {
	p, buf := newEvidencePacker(), []byte{evidenceFormat}
	for k, v := range ev {
		buf = p.appendPair(buf, k, v)
	}
	return buf
}

// PackedKeys are the keys the packed form writes as codes.
func PackedKeys() []string { return packedKeys[:] }

// CreateMigrationsTable is Migrate's first statement, for a test that
// applies the migrations before one of them by hand.
const CreateMigrationsTable = createMigrationsTable
