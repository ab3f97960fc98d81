package board

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dexaflow/reaper/sdk"
)

// sightingsSQL records a batch of pod sightings (sdk.PodSighting): the
// history of the windows in which the kube substrate's pod cache held no
// pod of a running attempt. It is the statement form of
// sdk.PodSighting.PodMissing. A sighting's times are when the cache saw
// the pod; the fence is at the sweep's time (At).
const sightingsSQL = leadCTE + `
r AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[], $7::timestamptz[],
                         $8::timestamptz[], $9::int8[], $10::timestamptz[])
        WITH ORDINALITY AS r(run_id, task_id, try_number, attempt_epoch, pod_uid, seen_at, missing_at, term, at, ord)
),
applied AS (
    UPDATE task_instances ti SET
        -- the cache received the pod Running after the attempt ran: a
        -- window ended then, and closed any window left open;
        pod_missing_max = CASE WHEN ti.running_at < r.seen_at
            THEN GREATEST(coalesce(ti.pod_missing_max, interval '0'), r.seen_at - ti.running_at)
            ELSE ti.pod_missing_max END,
        -- the cache saw the pod deleted while the attempt ran: a window
        -- opened (an open one keeps its start).
        pod_missing_since = CASE WHEN ti.running_at < r.seen_at THEN r.missing_at
            WHEN ti.running_at <= r.missing_at THEN coalesce(ti.pod_missing_since, r.missing_at)
            ELSE ti.pod_missing_since END
    FROM r
    WHERE -- the row still holds exactly the attempt whose pod was seen,
          ` + sameAttempt + `
          -- running on kube,
      AND ti.state = '` + sdk.StateRunning + `' AND ti.executor = '` + sdk.ExecutorKube + `'
          -- the pod is the one it records (a pod someone else made with the
          -- attempt's labels says nothing of the attempt's own),
      AND ti.pod_uid = r.pod_uid
          -- the sighting came after it ran,
      AND (ti.running_at < r.seen_at OR ti.running_at <= r.missing_at)
          -- and the sweep's term still leads.
      AND ` + fenced + `
    RETURNING r.ord
)` + batchAnswer

// RecordPodSightings records what the kube substrate's pod cache saw of
// running attempts' pods (see sdk.PodSighting): pod_missing_max and
// pod_missing_since, for reaperctl replay of pod_lost_floor. A sighting
// applies only while the row holds exactly its attempt, running on kube,
// with its pod UID recorded, and only with a part the attempt's
// running_at precedes (NoopMovedOn, NoopPodNotRecorded otherwise), under
// the current term (NoopDeposed). It changes no state and no updated_at:
// it is history, not a write anything is judged by.
func (s *Store) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	if err := checkSightings(ss); err != nil {
		return nil, fmt.Errorf("board: record pod sightings: %w", err)
	}
	b, err := newBatch("record pod sightings", ss, func(p sdk.PodSighting) (sdk.Attempt, int64, time.Time) { return p.Attempt, p.Term, p.At },
		func(i int, row sdk.TaskRow) string { return ss[i].Refusal(row) })
	if err != nil {
		return nil, fmt.Errorf("board: %w", err)
	}
	uids := make([]string, len(ss))
	seen, missing := make([]pgtype.Timestamptz, len(ss)), make([]pgtype.Timestamptz, len(ss))
	for i, p := range ss {
		uids[i] = p.PodUID
		seen[i] = pgtype.Timestamptz{Time: p.SeenAt, Valid: !p.SeenAt.IsZero()}
		missing[i] = pgtype.Timestamptz{Time: p.MissingAt, Valid: !p.MissingAt.IsZero()}
	}
	runIDs, taskIDs, tries, epochs := b.attemptArrays()
	return s.runBatch(ctx, b, sightingsSQL, runIDs, taskIDs, tries, epochs, uids, seen, missing, b.terms, b.ats)
}

// checkSightings refuses a batch larger than sdk.MaxPodSightings and a
// sighting that says nothing or contradicts itself, before anything is
// written. The in-memory board makes the same checks (sdk/sdktest).
func checkSightings(ss []sdk.PodSighting) error {
	if len(ss) > sdk.MaxPodSightings {
		return fmt.Errorf("%d sightings in one call: at most %d", len(ss), sdk.MaxPodSightings)
	}
	for _, p := range ss {
		if err := sdk.ValidSighting(p); err != nil {
			return fmt.Errorf("%s: %w", p.Attempt, err)
		}
	}
	return nil
}
