-- reaper: additive
-- The queued_at listing's index without the running attempts (issue #44).
--
-- A heartbeat moves last_heartbeat_at, which task_instances_heartbeat_idx
-- keys on, so no heartbeat's update is HOT: PostgreSQL writes a new entry
-- in every index whose predicate holds the running row, and WAL for each.
-- task_instances_queued_at_idx held the running rows too, yet no listing
-- reads running attempts in queued_at order from it: the warm-worker
-- reaper, the one listing of running attempts by queued_at, reads its own
-- index (migration 023), and every statement that counts or lists queued
-- and running rows by state alone has task_instances_running_at_idx, of
-- the same states. The index is rebuilt, under its own name, over the
-- other live states only: a heartbeat writes one index entry less. Every
-- binary that ran on the schema before keeps working: none of its listings
-- loses its plan. A listing of running attempts of another executor by
-- queued_at is still answered, by a scan of the running rows and a sort.
DROP INDEX task_instances_queued_at_idx;

CREATE INDEX task_instances_queued_at_idx
    ON task_instances (state, queued_at, run_id, task_id)
    WHERE state IN ('scheduled', 'queued', 'up_for_retry', 'up_for_reschedule', 'deferred');
