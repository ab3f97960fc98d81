-- Teardowns owed: a reap-time teardown that did not complete.
--
-- A reaper tears down the execution of what it reaped once its mark is on
-- the board. When that teardown fails (the API server refuses, throttles,
-- times out, or cannot be reached), the mark stays and the teardown is owed:
-- the host keeps one row here per attempt (or, for the orphan-run reap, per
-- run) and tries again on later cycles, with a bounded backoff, until the
-- substrate reports nothing of it left running. A row is removed only by a
-- retry that completed; the leader of any term picks up what an earlier one
-- left. Nothing here ever changes task_instances.
CREATE TABLE owed_teardowns (
    id              bigserial   PRIMARY KEY,
    run_id          text        NOT NULL,
    -- The attempt; all three NULL for a run's teardown (every execution of
    -- the run, the orphan-run reaper's).
    task_id         text,
    try_number      integer,
    attempt_epoch   integer,
    -- The UID the kube runner recorded for the attempt's pod, when known.
    pod_uid         text,
    -- The reaper whose teardown failed, and the decision label a failed try
    -- is metered under (its *_pod_delete_error).
    reaper          text        NOT NULL,
    label           text        NOT NULL,
    -- The teardown's reason (the mark: agent_lost, pod_lost, orphan_run, ...).
    reason          text        NOT NULL,
    tries           integer     NOT NULL DEFAULT 1
        CONSTRAINT owed_teardowns_tries_check CHECK (tries >= 1),
    first_failed_at timestamptz NOT NULL,
    last_tried_at   timestamptz NOT NULL,
    last_error      text        NOT NULL,
    next_try_at     timestamptz NOT NULL,
    -- The term of the last try.
    term            bigint      NOT NULL,
    CONSTRAINT owed_teardowns_attempt_check CHECK (
        (task_id IS NULL AND try_number IS NULL AND attempt_epoch IS NULL)
        OR (task_id IS NOT NULL AND try_number IS NOT NULL AND attempt_epoch IS NOT NULL))
);

-- One row per attempt, and one per run for a run's teardown.
CREATE UNIQUE INDEX owed_teardowns_attempt_idx
    ON owed_teardowns (run_id, task_id, try_number, attempt_epoch) WHERE task_id IS NOT NULL;
CREATE UNIQUE INDEX owed_teardowns_run_idx ON owed_teardowns (run_id) WHERE task_id IS NULL;

-- The retries that are due, oldest due first.
CREATE INDEX owed_teardowns_due_idx ON owed_teardowns (next_try_at, id);
