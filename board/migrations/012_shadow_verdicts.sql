-- Shadow decisions, scored: the verdict on a decision that said an attempt
-- was lost, once the board knows what became of the attempt. Written by
-- the leader's scorer (host/audit), once per decision, fenced by its term.
--
-- verdict: would_have_killed_live_work (the attempt heartbeated, reported
-- or succeeded after the decision), right (it never came back and was
-- settled lost, its mark confirmed, or its run failed), unresolved (no
-- truth within the horizon, or none can arrive any more). NULL: unscored.
-- verdict_at and verdict_term: when, and under which leadership term, the
-- verdict was written. verdict_evidence: what the scorer saw of the
-- attempt (its state, the heartbeat or report after the decision, ...).
ALTER TABLE reap_decisions
    ADD COLUMN verdict          text
        CONSTRAINT reap_decisions_verdict_check
        CHECK (verdict IN ('would_have_killed_live_work', 'right', 'unresolved')),
    ADD COLUMN verdict_at       timestamptz,
    ADD COLUMN verdict_term     bigint,
    ADD COLUMN verdict_evidence jsonb,
    ADD CONSTRAINT reap_decisions_verdict_stamped_check
        CHECK ((verdict IS NULL) = (verdict_at IS NULL) AND (verdict IS NULL) = (verdict_term IS NULL));

-- The decisions still to score, in the order they were written: a dry-run
-- decision that would have failed an attempt, and an applied infra mark
-- whose truth can still arrive (held for review, or provisional on kube,
-- where a durable SUCCESS may still override it). Scored rows leave the
-- index, so it holds only what is pending. The predicate is the board's
-- (board/verdicts.go builds its query from the same lists, and a test
-- holds the two to the same text).
CREATE INDEX reap_decisions_unscored_idx ON reap_decisions (id)
    WHERE verdict IS NULL AND task_id IS NOT NULL AND (
        (dry_run AND label IN ('agent_lost', 'agent_lost_never_heartbeated', 'agent_lost_orphan_stopped',
            'dispatch_lost', 'dispatch_lost_orphan_stopped', 'start_expired', 'pod_lost', 'warm_worker_lost',
            'credential_ceiling'))
        OR (applied AND label IN ('agent_lost', 'agent_lost_never_heartbeated', 'agent_lost_orphan_stopped',
            'dispatch_lost', 'dispatch_lost_orphan_stopped', 'start_expired', 'pod_lost', 'warm_worker_lost')
            AND (evidence->>'policy' = 'hold' OR evidence->>'edition' = 'kube')));
