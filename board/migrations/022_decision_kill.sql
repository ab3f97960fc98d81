-- reaper: additive
-- kill: the decision failed an attempt, or would have in a dry run: its
-- label is one of the kill labels the reaper it is filed under declared
-- (board.Scoring, written with the row, as scored is). reaperctl shadow
-- reads the decisions that failed attempts by it, not by a list of
-- labels, so a plugin's own kill labels count as the in-tree ones do.
-- The existing rows are set as reaperctl shadow read them until now: by
-- the in-tree reapers' kill labels (sdk.KillLabels; a test holds this
-- list to it).
--
-- Additive: a binary of schema 21 neither reads nor writes it (a row it
-- writes reads as no kill until it is replaced).
ALTER TABLE reap_decisions ADD COLUMN kill boolean NOT NULL DEFAULT false;

UPDATE reap_decisions SET kill = true
    WHERE label IN ('agent_lost', 'agent_lost_never_heartbeated', 'agent_lost_orphan_stopped',
        'dispatch_lost', 'dispatch_lost_orphan_stopped', 'start_expired', 'pod_lost', 'warm_worker_lost',
        'credential_ceiling');
