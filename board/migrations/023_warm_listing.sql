-- reaper: additive
-- The warm-worker reaper's listing on an index of its own rows (issue #44).
--
-- warmworker lists the queued and running attempts of the warm pool, oldest
-- queued first, with no threshold a healthy attempt stays under: every one
-- of them is listed each pass. On task_instances_queued_at_idx it walked
-- every queued and running attempt of every executor and dropped the
-- others by a heap read each, so a fleet of 150,000 kube attempts and no
-- warm one cost it tens of milliseconds a pass. This index holds the warm
-- pool's attempts only: the listing reads what it returns.
CREATE INDEX task_instances_warm_queued_at_idx
    ON task_instances (state, queued_at, run_id, task_id)
    WHERE executor = 'warm' AND state IN ('queued', 'running');
