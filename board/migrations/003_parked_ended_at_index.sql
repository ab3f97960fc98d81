-- Candidate listing of parked attempts by the time they parked.
--
-- An attempt parked up_for_retry, up_for_reschedule or deferred waits for the
-- scheduler to bring it back; its report (or the mark that failed it) stamped
-- ended_at, so ended_at is when it parked. A reaper of attempts parked far
-- past a TTL lists them oldest first by it, a range scan like the listings of
-- migration 001.
CREATE INDEX task_instances_parked_ended_at_idx
    ON task_instances (state, ended_at, run_id, task_id)
    WHERE state IN ('up_for_retry', 'up_for_reschedule', 'deferred');
