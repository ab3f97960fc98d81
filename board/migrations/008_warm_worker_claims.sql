-- The last claim of every warm worker, as the attempt API accepted it.
--
-- One row per worker, replaced on each accepted claim by a newer one: the
-- claim's time (the issue time of the worker token it presented, so the
-- claim covers every attempt handed to the worker before then) and which
-- attempts the worker said it runs, a jsonb array of {"run_id", "task_id",
-- "try", "epoch"}. running is NULL when the claim did not say (a worker
-- from before this version): that is "unknown", never "runs nothing". The
-- kube sweep reads it, joined on task_instances.warm_worker, to confirm a
-- provisional warm mark whose live worker claimed after the mark without
-- the attempt.
CREATE TABLE warm_worker_claims (
    worker     text PRIMARY KEY CHECK (worker <> ''),
    claimed_at timestamptz NOT NULL,
    running    jsonb CHECK (running IS NULL OR jsonb_typeof(running) = 'array')
);
