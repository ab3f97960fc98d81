-- Orphan-run candidates without scanning every running run.
--
-- A run can only be orphaned once some task instance of it is not live, so
-- the orphan-run listing starts from the task instances that are not live
-- and belong to a run that is not finished. run_closed marks the task
-- instances of a finished run; it is set in the same statement that
-- finishes the run and never on a running run's rows, so the index below
-- holds every not-live task instance of every unfinished run and, in a
-- healthy steady state, almost nothing. (Whether a candidate run still has
-- a live task instance is then a probe of the primary key by run_id: no
-- index of live rows is kept, since every heartbeat would have to update it.)
ALTER TABLE task_instances ADD COLUMN run_closed boolean NOT NULL DEFAULT false;

UPDATE task_instances ti SET run_closed = true
FROM runs r
WHERE r.run_id = ti.run_id AND r.state IN ('success', 'failed');

CREATE INDEX task_instances_open_settled_idx ON task_instances (run_id)
WHERE NOT run_closed
  AND state IN ('none', 'success', 'failed', 'skipped', 'upstream_failed')
  AND held_at IS NULL
  AND NOT (state = 'failed' AND coalesce(last_failure_kind, '') = 'infra' AND infra_confirmed_at IS NULL);
