-- The history reaperctl replay judges thresholds against, kept on the
-- writes that already happen: nothing more is written per heartbeat.
--
-- max_heartbeat_gap: the longest silence of the current attempt while it
-- ran, as the attempt API measured it on each heartbeat's own UPDATE: from
-- the previous heartbeat (the first one from running_at) to this one, but
-- never from before the answering replica began serving, so that a time
-- when no replica could hear an agent is not counted as the agent's.
-- pod_created_at: when the API server created the attempt's pod (the kube
-- runner records it with pod_uid); with running_at it is the pod's time to
-- start. Every rail that starts a new execution clears both.
ALTER TABLE task_instances
    ADD COLUMN max_heartbeat_gap interval,
    ADD COLUMN pod_created_at    timestamptz;

-- attempt_history: each attempt as it stood when a rail moved its task on
-- to a new execution (the row's try or epoch changed). The attempt still
-- in task_instances is each task's latest; together they are every attempt
-- the board ran. One row per attempt, written by the trigger below inside
-- the rail's own UPDATE.
CREATE TABLE attempt_history (
    run_id               text        NOT NULL,
    task_id              text        NOT NULL,
    try_number           integer     NOT NULL,
    attempt_epoch        integer     NOT NULL,
    executor             text        NOT NULL,
    state                text        NOT NULL,
    queued_at            timestamptz,
    running_at           timestamptz,
    last_heartbeat_at    timestamptz,
    ended_at             timestamptz,
    last_failure_kind    text,
    failure_reason       text,
    infra_marked_at      timestamptz,
    infra_confirmed_at   timestamptz,
    credential_minted_at timestamptz,
    max_heartbeat_gap    interval,
    pod_uid              text,
    pod_created_at       timestamptz,
    -- When the rail released the attempt (the UPDATE's updated_at).
    released_at          timestamptz NOT NULL,
    PRIMARY KEY (run_id, task_id, try_number, attempt_epoch),
    FOREIGN KEY (run_id, task_id) REFERENCES task_instances (run_id, task_id) ON DELETE CASCADE
);

-- A replay reads a window of history by its release.
CREATE INDEX attempt_history_released_at_idx ON attempt_history (released_at);

CREATE FUNCTION attempt_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state,
        queued_at, running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason,
        infra_marked_at, infra_confirmed_at, credential_minted_at, max_heartbeat_gap,
        pod_uid, pod_created_at, released_at)
    VALUES (OLD.run_id, OLD.task_id, OLD.try_number, OLD.attempt_epoch, OLD.executor, OLD.state,
        OLD.queued_at, OLD.running_at, OLD.last_heartbeat_at, OLD.ended_at, OLD.last_failure_kind,
        OLD.failure_reason, OLD.infra_marked_at, OLD.infra_confirmed_at, OLD.credential_minted_at,
        OLD.max_heartbeat_gap, OLD.pod_uid, OLD.pod_created_at, NEW.updated_at)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- Only a new execution fires it: a heartbeat, a report or a mark keeps the
-- try and the epoch, and the WHEN clause rejects it before any call.
CREATE TRIGGER task_instances_attempt_history
    AFTER UPDATE OF try_number, attempt_epoch ON task_instances
    FOR EACH ROW
    WHEN (OLD.try_number IS DISTINCT FROM NEW.try_number OR OLD.attempt_epoch IS DISTINCT FROM NEW.attempt_epoch)
    EXECUTE FUNCTION attempt_history_record();
