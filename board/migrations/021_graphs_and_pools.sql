-- reaper: floor=21
-- The built-in scheduler's graphs and pools (docs/board.md).
--
-- Runs as graphs: a task instance may name tasks of its own run as its
-- upstreams. The runner schedules it only once every upstream succeeded,
-- settles it upstream_failed once one failed for good, and skipped once one
-- was skipped.
--
-- Pools and slots: each task instance takes pool_slots of its pool's slots
-- while it is queued or running; a run may bound how many of its task
-- instances are queued or running at once (max_active_tasks, NULL: no
-- bound). The runner dispatches only into open slots.
--
-- A binary that knows neither would schedule a task before what it depends
-- on and past its pool's slots, so the floor rises to this migration.
ALTER TABLE task_instances
    ADD COLUMN upstreams text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT task_instances_upstreams_self_check CHECK (NOT (task_id = ANY (upstreams))),
    ADD COLUMN pool text NOT NULL DEFAULT 'default_pool',
    ADD COLUMN pool_slots integer NOT NULL DEFAULT 1
        CONSTRAINT task_instances_pool_slots_check CHECK (pool_slots >= 1);

ALTER TABLE runs
    ADD COLUMN max_active_tasks integer
        CONSTRAINT runs_max_active_tasks_check CHECK (max_active_tasks > 0);

-- The slots in use, by pool: the queued and running task instances only.
CREATE INDEX task_instances_pool_active_idx
    ON task_instances (pool, run_id) INCLUDE (pool_slots)
    WHERE state IN ('queued', 'running');

-- The task instances waiting in state none: what each runner cycle judges
-- against its upstreams (schedule, or settle as blocked). A run of many
-- tasks holds them there until their upstreams end; the working set's
-- other task instances are never read for it.
CREATE INDEX task_instances_none_idx
    ON task_instances (executor, run_id, task_id)
    WHERE state = 'none';
