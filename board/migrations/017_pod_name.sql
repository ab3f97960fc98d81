-- The name of the pod the kube runner created for an attempt, recorded with
-- its UID (pod_uid) once the create has answered.
--
-- A task pod's name is no longer a function of the attempt alone: it ends
-- in a part drawn at random for each dispatch, so that nobody can create a
-- pod under an attempt's name before the runner does. Whatever reads an
-- attempt's pod by name (an operator, the runner's valve) reads it here.
-- NULL: no pod recorded, or one recorded before this column (its name was
-- the attempt's deterministic one). Every rail that starts a new execution
-- clears it with pod_uid, and the history trigger keeps it with the
-- released attempt.
ALTER TABLE task_instances ADD COLUMN pod_name text;

ALTER TABLE attempt_history ADD COLUMN pod_name text;

CREATE OR REPLACE FUNCTION attempt_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state,
        queued_at, running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason,
        infra_marked_at, infra_confirmed_at, credential_minted_at, max_heartbeat_gap,
        pod_uid, pod_name, pod_created_at, pod_missing_max, pod_missing_since, reconciled_as, reconciled_at,
        released_at)
    VALUES (OLD.run_id, OLD.task_id, OLD.try_number, OLD.attempt_epoch, OLD.executor, OLD.state,
        OLD.queued_at, OLD.running_at, OLD.last_heartbeat_at, OLD.ended_at, OLD.last_failure_kind,
        OLD.failure_reason, OLD.infra_marked_at, OLD.infra_confirmed_at, OLD.credential_minted_at,
        OLD.max_heartbeat_gap, OLD.pod_uid, OLD.pod_name, OLD.pod_created_at, OLD.pod_missing_max,
        OLD.pod_missing_since, OLD.reconciled_as, OLD.reconciled_at, NEW.updated_at)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
