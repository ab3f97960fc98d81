package boardhistory

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// triggersSQL makes the database keep its own history of every change of a
// task instance's state or attempt, of a run's state and of the leader
// row's term, and of every heartbeat that landed (see the package
// documentation).
const triggersSQL = `
CREATE FUNCTION fault_history_writer() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(current_setting('application_name', true), '') $$;
CREATE FUNCTION fault_history_fenced() RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'
        AND relation = 'leader'::regclass AND mode = 'RowShareLock' AND granted) $$;
CREATE FUNCTION fault_history_lead_holder() RETURNS text LANGUAGE sql AS $$
    SELECT holder FROM leader ORDER BY term DESC LIMIT 1 $$;

CREATE TABLE fault_history_ti (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL, run_id text NOT NULL, task_id text NOT NULL,
    old_try int NOT NULL, old_epoch int NOT NULL, new_try int NOT NULL, new_epoch int NOT NULL,
    old_state text NOT NULL, new_state text NOT NULL, failure_reason text, failure_kind text, term bigint,
    old_failure_kind text, writer text, fenced boolean, lead_holder text);
CREATE FUNCTION fault_history_ti_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_history_ti (at, run_id, task_id, old_try, old_epoch, new_try, new_epoch,
        old_state, new_state, failure_reason, failure_kind, term, old_failure_kind, writer, fenced, lead_holder)
    VALUES (clock_timestamp(), NEW.run_id, NEW.task_id, OLD.try_number, OLD.attempt_epoch,
        NEW.try_number, NEW.attempt_epoch, OLD.state, NEW.state, NEW.failure_reason, NEW.last_failure_kind,
        (SELECT max(term) FROM leader), OLD.last_failure_kind, fault_history_writer(), fault_history_fenced(),
        fault_history_lead_holder());
    RETURN NULL;
END $$;
CREATE TRIGGER fault_history_ti AFTER UPDATE ON task_instances FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.try_number <> NEW.try_number
          OR OLD.attempt_epoch <> NEW.attempt_epoch)
    EXECUTE FUNCTION fault_history_ti_log();

CREATE TABLE fault_history_hb (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL, run_id text NOT NULL, task_id text NOT NULL, try int NOT NULL, epoch int NOT NULL);
CREATE FUNCTION fault_history_hb_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_history_hb (at, run_id, task_id, try, epoch)
    VALUES (clock_timestamp(), NEW.run_id, NEW.task_id, NEW.try_number, NEW.attempt_epoch);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_history_hb AFTER UPDATE ON task_instances FOR EACH ROW
    WHEN (OLD.last_heartbeat_at IS DISTINCT FROM NEW.last_heartbeat_at) EXECUTE FUNCTION fault_history_hb_log();

CREATE TABLE fault_history_run (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL, run_id text NOT NULL, old_state text NOT NULL, new_state text NOT NULL, term bigint,
    writer text, fenced boolean, lead_holder text);
CREATE FUNCTION fault_history_run_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_history_run (at, run_id, old_state, new_state, term, writer, fenced, lead_holder)
    VALUES (clock_timestamp(), NEW.run_id, OLD.state, NEW.state, (SELECT max(term) FROM leader),
        fault_history_writer(), fault_history_fenced(), fault_history_lead_holder());
    RETURN NULL;
END $$;
CREATE TRIGGER fault_history_run AFTER UPDATE ON runs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION fault_history_run_log();

CREATE TABLE fault_history_leader (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL, term bigint NOT NULL, holder text);
CREATE FUNCTION fault_history_leader_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_history_leader (at, term, holder) VALUES (clock_timestamp(), NEW.term, NEW.holder);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_history_leader_insert AFTER INSERT ON leader FOR EACH ROW
    EXECUTE FUNCTION fault_history_leader_log();
CREATE TRIGGER fault_history_leader_update AFTER UPDATE ON leader FOR EACH ROW
    WHEN (OLD.term IS DISTINCT FROM NEW.term) EXECUTE FUNCTION fault_history_leader_log();
`

// Install adds the history's tables and triggers to a migrated board. Run
// it once, before any replica writes.
func Install(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, triggersSQL); err != nil {
		return fmt.Errorf("boardhistory: install the history triggers: %w", err)
	}
	return nil
}
