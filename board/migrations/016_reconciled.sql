-- Which of the reconciler's writes last changed an attempt, and when, so
-- that a leader killed between a sweep's write and its audit leaves a trace
-- the next leader can audit from (board.UnauditedMarks). A mark is told
-- apart by its failure reason; a sweep's settlement may leave none (a
-- success, a task failure in the agent's own words), so the write names
-- itself.
--
-- reconciled_as: the reconcile_* label of the write (reconcile_settled,
-- reconcile_infra_confirmed, reconcile_infra_override); reconciled_at: the
-- sweep's time of it. Only the reconciler's guarded statements set them;
-- every rail that starts a new execution clears them, and the history
-- trigger keeps them with the released attempt, so a write whose attempt
-- has already been re-placed or retried is still found.
ALTER TABLE task_instances
    ADD COLUMN reconciled_as text,
    ADD COLUMN reconciled_at timestamptz;

ALTER TABLE attempt_history
    ADD COLUMN reconciled_as text,
    ADD COLUMN reconciled_at timestamptz;

CREATE OR REPLACE FUNCTION attempt_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state,
        queued_at, running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason,
        infra_marked_at, infra_confirmed_at, credential_minted_at, max_heartbeat_gap,
        pod_uid, pod_created_at, pod_missing_max, pod_missing_since, reconciled_as, reconciled_at,
        released_at)
    VALUES (OLD.run_id, OLD.task_id, OLD.try_number, OLD.attempt_epoch, OLD.executor, OLD.state,
        OLD.queued_at, OLD.running_at, OLD.last_heartbeat_at, OLD.ended_at, OLD.last_failure_kind,
        OLD.failure_reason, OLD.infra_marked_at, OLD.infra_confirmed_at, OLD.credential_minted_at,
        OLD.max_heartbeat_gap, OLD.pod_uid, OLD.pod_created_at, OLD.pod_missing_max, OLD.pod_missing_since,
        OLD.reconciled_as, OLD.reconciled_at, NEW.updated_at)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
