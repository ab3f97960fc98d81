-- reaper: floor=20
-- Runs as graphs: a task instance may name tasks of its own run as its
-- upstreams. The runner schedules it only once every upstream succeeded,
-- settles it upstream_failed once one failed for good, and skipped once one
-- was skipped (docs/board.md). A binary that knows no upstreams would
-- schedule such a task at once, beside or before what it depends on, so the
-- floor rises to this migration.
ALTER TABLE task_instances
    ADD COLUMN upstreams text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT task_instances_upstreams_self_check CHECK (NOT (task_id = ANY (upstreams)));
