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

-- The exchanges of warm workers' bootstrap credentials: a warm worker's pod
-- spec carries a bootstrap token bound to the worker's name, which the
-- worker trades once for its worker token. One row per bootstrap token (the
-- worker and the token's issue time); a second exchange of the same token
-- finds its row and is refused. A row is worth keeping only while its token
-- could still verify: each exchange removes the rows past their expiry.
CREATE TABLE worker_credential_exchanges (
    worker       text        NOT NULL,
    issued_at    timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    exchanged_at timestamptz NOT NULL,
    PRIMARY KEY (worker, issued_at)
);
CREATE INDEX worker_credential_exchanges_expiry_idx ON worker_credential_exchanges (expires_at);
