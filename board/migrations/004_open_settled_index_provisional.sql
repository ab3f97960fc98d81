-- Orphan-run candidates include provisional infra marks.
--
-- Migration 002 left provisional (unconfirmed) infra marks out of the
-- orphan-run candidates, since such a mark kept its run alive for good. A
-- provisional mark now keeps its run alive only inside the infra
-- confirmation valve (or while the planner will re-place it), so one past
-- the valve must be found by the listing. The index keeps out what is
-- always live or already finished: held attempts, the live states and the
-- rows of finished runs.
DROP INDEX task_instances_open_settled_idx;

CREATE INDEX task_instances_open_settled_idx ON task_instances (run_id)
WHERE NOT run_closed
  AND state IN ('none', 'success', 'failed', 'skipped', 'upstream_failed')
  AND held_at IS NULL;
