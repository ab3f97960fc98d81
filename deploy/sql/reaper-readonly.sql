-- reaper-readonly: a role for operators who only look at the board.
--
-- reaperctl's read commands (status, explain, tune, replay, shadow, held)
-- work with it; its writing commands (submit, mark, release) are refused
-- by the database and change nothing. Run this file as the board's owner
-- (or a superuser), connected to the board's database, after
-- `reaperd migrate`, and again after every upgrade whose migrations add a
-- table: a GRANT names the tables that exist when it runs.
--
--   psql "$OWNER_DSN" -v ON_ERROR_STOP=1 -f deploy/sql/reaper-readonly.sql
--
-- Then give it to each operator's own login, e.g.
--
--   CREATE ROLE alice LOGIN PASSWORD '...' IN ROLE reaper_readonly;
--
-- The board's tables are in the schema `public`; if yours live elsewhere,
-- replace `public` below.

-- The role itself: no login, no privilege of its own beyond these grants.
-- Created only when missing, so the file can be run again.
DO $$
BEGIN
    CREATE ROLE reaper_readonly NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

GRANT USAGE ON SCHEMA public TO reaper_readonly;

-- Exactly what the read commands read:
GRANT SELECT ON TABLE
    schema_migrations,  -- every command: the schema this binary knows
    runs,               -- status, explain, tune, replay, shadow, held
    task_instances,     -- the same
    attempt_history,    -- replay, shadow: released attempts
    attempt_log,        -- explain: the try log
    reap_decisions,     -- explain, shadow: the audit
    owed_teardowns,     -- explain: teardowns still owed
    leader,             -- status: who leads, which term
    fence_refusals      -- status: the writes the fence refused
TO reaper_readonly;

-- Not granted: warm_worker_claims and worker_credential_exchanges (the
-- attempt API's bookkeeping, no read command needs them), and no INSERT,
-- UPDATE, DELETE, TRUNCATE or sequence use on anything.
