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

// OrphanRunsSQL is the statement and arguments of ListOrphanRuns for q.
func OrphanRunsSQL(q sdk.RunQuery) (string, []any) {
	sql, args, _ := orphanRunsSQL(q)
	return sql, args
}

// UnscoredQuery is the statement UnscoredDecisions runs, for EXPLAIN.
var UnscoredQuery = unscoredQuery
