-- What the kube substrate's pod cache missed of a running attempt's pod,
-- for reaperctl replay of pod_lost_floor. Written by the reconcile sweep
-- from what the presence informer saw since the last sweep, one guarded
-- statement a sweep; nothing is written per pod event.
--
-- pod_missing_max: the largest (end of a window in which the cache held no
-- pod of the attempt while the attempt ran) - running_at. A floor under it
-- would have let the pod-lost reaper's staleness gate through inside that
-- window. A window ends when the cache receives the attempt's recorded pod
-- already Running (it had never held it: a watch gap, a slow relist). The
-- cache's first list after the substrate starts is not a window: the pods
-- were missing because the substrate was not running, not because its
-- cache lagged (as max_heartbeat_gap does not count a replica's own
-- downtime).
-- pod_missing_since: the start of a window still open: the cache saw the
-- attempt's recorded pod deleted while the attempt ran. replay ends it at
-- the attempt's last proof of life after it (a heartbeat, its own outcome).
-- Every rail that starts a new execution clears both.
ALTER TABLE task_instances
    ADD COLUMN pod_missing_max   interval,
    ADD COLUMN pod_missing_since timestamptz;

ALTER TABLE attempt_history
    ADD COLUMN pod_missing_max   interval,
    ADD COLUMN pod_missing_since timestamptz;

-- The history trigger keeps them with the released attempt.
CREATE OR REPLACE FUNCTION attempt_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_history (run_id, task_id, try_number, attempt_epoch, executor, state,
        queued_at, running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason,
        infra_marked_at, infra_confirmed_at, credential_minted_at, max_heartbeat_gap,
        pod_uid, pod_created_at, pod_missing_max, pod_missing_since, released_at)
    VALUES (OLD.run_id, OLD.task_id, OLD.try_number, OLD.attempt_epoch, OLD.executor, OLD.state,
        OLD.queued_at, OLD.running_at, OLD.last_heartbeat_at, OLD.ended_at, OLD.last_failure_kind,
        OLD.failure_reason, OLD.infra_marked_at, OLD.infra_confirmed_at, OLD.credential_minted_at,
        OLD.max_heartbeat_gap, OLD.pod_uid, OLD.pod_created_at, OLD.pod_missing_max, OLD.pod_missing_since,
        NEW.updated_at)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
