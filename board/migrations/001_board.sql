-- The board: the part of the scheduler's metadatabase that reaping reads and
-- writes. Column names are a public contract (docs/board.md).

CREATE TABLE runs (
    run_id        text        PRIMARY KEY,
    dag_id        text        NOT NULL,
    state         text        NOT NULL
        CONSTRAINT runs_state_check CHECK (state IN ('queued', 'running', 'success', 'failed')),
    started_at    timestamptz,
    ended_at      timestamptz,
    error_message text,
    updated_at    timestamptz NOT NULL,
    -- A running run always has a start: the orphan check measures from it.
    CONSTRAINT runs_running_started_check CHECK (state <> 'running' OR started_at IS NOT NULL)
);

-- The orphan-run listing walks running runs only.
CREATE INDEX runs_running_idx ON runs (run_id) WHERE state = 'running';

CREATE TABLE task_instances (
    run_id                     text        NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    task_id                    text        NOT NULL,
    try_number                 integer     NOT NULL DEFAULT 1
        CONSTRAINT task_instances_try_number_check CHECK (try_number >= 1),
    attempt_epoch              integer     NOT NULL DEFAULT 0
        CONSTRAINT task_instances_attempt_epoch_check CHECK (attempt_epoch >= 0),
    state                      text        NOT NULL DEFAULT 'none'
        CONSTRAINT task_instances_state_check CHECK (state IN (
            'none', 'scheduled', 'queued', 'running', 'success', 'failed', 'skipped',
            'upstream_failed', 'up_for_retry', 'up_for_reschedule', 'deferred')),
    executor                   text        NOT NULL
        CONSTRAINT task_instances_executor_check CHECK (executor IN ('kube', 'lite', 'warm')),
    queued_at                  timestamptz,
    running_at                 timestamptz,
    last_heartbeat_at          timestamptz,
    released_at                timestamptz,
    ended_at                   timestamptz,
    last_failure_kind          text
        CONSTRAINT task_instances_last_failure_kind_check CHECK (last_failure_kind IN ('task', 'infra')),
    -- The label of the mark or report that failed the current attempt
    -- (agent_lost, dispatch_lost, credential_ceiling, ...).
    failure_reason             text,
    infra_marked_at            timestamptz,
    infra_confirmed_at         timestamptz,
    infra_budget               integer     NOT NULL DEFAULT 3
        CONSTRAINT task_instances_infra_budget_check CHECK (infra_budget >= 0),
    infra_used                 integer     NOT NULL DEFAULT 0
        CONSTRAINT task_instances_infra_used_check CHECK (infra_used >= 0),
    -- Retries left; max_retries is what the task declares and what a clear restores.
    retries                    integer     NOT NULL DEFAULT 0
        CONSTRAINT task_instances_retries_check CHECK (retries >= 0),
    max_retries                integer     NOT NULL DEFAULT 0
        CONSTRAINT task_instances_max_retries_check CHECK (max_retries >= 0),
    error_message              text,
    warm_worker                text,
    dispatch_unavailable_since timestamptz,
    -- Held for an operator's review: no rail re-places the attempt until released.
    held_at                    timestamptz,
    -- What the Lite runner executes, and the task's declared execution timeout.
    command                    text,
    execution_timeout_seconds  integer
        CONSTRAINT task_instances_execution_timeout_check CHECK (execution_timeout_seconds > 0),
    updated_at                 timestamptz NOT NULL,
    PRIMARY KEY (run_id, task_id)
);

-- Candidate listings. Each index leads with the state (a listing always names
-- its states), then the threshold timestamp and the keyset tiebreak, so a page
-- is a range scan that stops after the limit. They cover only the states a
-- reaper can act on, so settled history never enters them.
CREATE INDEX task_instances_queued_at_idx
    ON task_instances (state, queued_at, run_id, task_id)
    WHERE state IN ('scheduled', 'queued', 'running', 'up_for_retry', 'up_for_reschedule', 'deferred');
CREATE INDEX task_instances_running_at_idx
    ON task_instances (state, running_at, run_id, task_id)
    WHERE state IN ('scheduled', 'queued', 'running', 'up_for_retry', 'up_for_reschedule', 'deferred');
CREATE INDEX task_instances_heartbeat_idx
    ON task_instances (state, last_heartbeat_at, run_id, task_id)
    WHERE state IN ('scheduled', 'queued', 'running', 'up_for_retry', 'up_for_reschedule', 'deferred');
-- Running attempts that never heartbeated (the Lite never-heartbeated check).
CREATE INDEX task_instances_never_heartbeated_idx
    ON task_instances (running_at, run_id, task_id)
    WHERE state = 'running' AND last_heartbeat_at IS NULL;
-- Infra marks, by the time they were made (the confirmation valve).
CREATE INDEX task_instances_infra_marked_at_idx
    ON task_instances (state, infra_marked_at, run_id, task_id)
    WHERE infra_marked_at IS NOT NULL;

CREATE TABLE attempt_log (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        text        NOT NULL,
    task_id       text        NOT NULL,
    try_number    integer     NOT NULL,
    attempt_epoch integer     NOT NULL,
    at            timestamptz NOT NULL,
    line          text        NOT NULL,
    FOREIGN KEY (run_id, task_id) REFERENCES task_instances (run_id, task_id) ON DELETE CASCADE
);

CREATE INDEX attempt_log_attempt_idx ON attempt_log (run_id, task_id, try_number, attempt_epoch, id);

CREATE TABLE reap_decisions (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL,
    term          bigint      NOT NULL,
    reaper        text        NOT NULL,
    label         text        NOT NULL
        CONSTRAINT reap_decisions_label_check CHECK (label <> ''),
    run_id        text,
    task_id       text,
    try_number    integer,
    attempt_epoch integer,
    applied       boolean     NOT NULL,
    dry_run       boolean     NOT NULL,
    detail        text        NOT NULL DEFAULT '',
    evidence      jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX reap_decisions_task_idx ON reap_decisions (run_id, task_id, id);
CREATE INDEX reap_decisions_at_idx ON reap_decisions (at);

CREATE TABLE leader (
    name        text        PRIMARY KEY,
    term        bigint      NOT NULL
        CONSTRAINT leader_term_check CHECK (term > 0),
    holder      text,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    -- NULL once the holder resigned: free for anyone.
    expires_at  timestamptz
);
