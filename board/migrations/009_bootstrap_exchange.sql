-- The exchange of the attempt's bootstrap credential.
--
-- A runner hands an attempt's agent a bootstrap token (in a pod spec, where
-- anyone allowed to read pods can see it); the agent's first call trades it
-- for the attempt's working token. credential_exchanged_at records that
-- trade: while it is set, a second exchange for the same attempt is refused,
-- so the copy in the pod spec is worth nothing once the agent has started.
-- NULL: not exchanged (or an attempt whose agent was handed a working token
-- directly, as a warm worker's claim does). Every rail that starts a new
-- execution clears it with the other credential columns.
ALTER TABLE task_instances
    ADD COLUMN credential_exchanged_at timestamptz;
