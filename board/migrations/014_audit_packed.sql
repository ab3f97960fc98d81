-- The audit row made cheaper to write (issue #30): what a mass recovery
-- pays a decision in PostgreSQL.
--
-- evidence_packed: a decision's evidence in the board's compact binary
-- form (board/evidence.go), stored as it comes. Parsing every object into
-- jsonb was a third of a row's cost in the server, and no query reads
-- into it but the one test below, now a column of its own. Rows written
-- before this migration keep their evidence in the jsonb column evidence
-- (NULL from now on); the board reads either.
--
-- scored: the decision is one the shadow scorer judges (board.Scored,
-- written with the row): a dry-run decision that would have failed an
-- attempt, an applied infra mark still provisional or held. It was a test
-- of the evidence's policy and edition in the pending index's predicate;
-- the existing rows are set from that same test here.
ALTER TABLE reap_decisions
    ALTER COLUMN evidence DROP NOT NULL,
    ALTER COLUMN evidence DROP DEFAULT,
    ADD COLUMN evidence_packed bytea,
    ADD COLUMN scored boolean NOT NULL DEFAULT false;

UPDATE reap_decisions SET scored = true
    WHERE task_id IS NOT NULL AND (
        (dry_run AND label IN ('agent_lost', 'agent_lost_never_heartbeated', 'agent_lost_orphan_stopped',
            'dispatch_lost', 'dispatch_lost_orphan_stopped', 'start_expired', 'pod_lost', 'warm_worker_lost',
            'credential_ceiling'))
        OR (applied AND label IN ('agent_lost', 'agent_lost_never_heartbeated', 'agent_lost_orphan_stopped',
            'dispatch_lost', 'dispatch_lost_orphan_stopped', 'start_expired', 'pod_lost', 'warm_worker_lost')
            AND (evidence->>'policy' = 'hold' OR evidence->>'edition' = 'kube')));

-- The decisions still to score, in the order they were written (the
-- scorer's range scan, as before).
DROP INDEX reap_decisions_unscored_idx;
CREATE INDEX reap_decisions_unscored_idx ON reap_decisions (id) WHERE verdict IS NULL AND scored;

-- explain's index without the id: a task's decisions are a few, sorted by
-- id once read, and a key of run and task alone is deduplicated, which
-- makes every audit row's insert into it cheaper.
DROP INDEX reap_decisions_task_idx;
CREATE INDEX reap_decisions_task_idx ON reap_decisions (run_id, task_id);
