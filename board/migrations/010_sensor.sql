-- Sensors: the only tasks that may end a poke up_for_reschedule, and the
-- bounds on how long their pokes may go on.
--
-- sensor: declared at submit. Any other task that reports (or leaves a
-- record saying) up_for_reschedule is failed as a task failure
-- (reschedule_not_sensor) instead of parked.
-- sensor_timeout_seconds: the sensor's own timeout, counted from
-- first_poke_at; a sensor must declare one.
-- first_poke_at: when the try's first poke reported running. Kept by the
-- rails that bump only the epoch (reschedule, re-place, ...), cleared with
-- the try (retry, clear).
-- try_dispatched_at: when the try was first queued (dispatched); the
-- credential ceiling of a sensor's pokes counts from it, not from each
-- poke's own mint. Kept and cleared like first_poke_at.
ALTER TABLE task_instances
    ADD COLUMN sensor                 boolean NOT NULL DEFAULT false,
    ADD COLUMN sensor_timeout_seconds integer,
    ADD COLUMN first_poke_at          timestamptz,
    ADD COLUMN try_dispatched_at      timestamptz,
    ADD CONSTRAINT task_instances_sensor_timeout_check CHECK (
        (NOT sensor AND sensor_timeout_seconds IS NULL) OR (sensor AND sensor_timeout_seconds > 0));
