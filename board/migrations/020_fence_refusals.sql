-- reaper: additive
-- The fence's refusals kept, and the audit's writer named (issue #41).
--
-- fence_refusals: one row per call the board's fence refused (a refused
-- batch is one row), written after the refusal, outside any fence: a
-- replica that has lost its term can still say what it was refused. It
-- names the write, the term and holder the writer claimed, the writer's
-- own time (the lease is compared with it), up to the first 64 attempts
-- the call named (requests counts them all), and the leader row as the
-- refusing fence saw it (or, where that fence does not say, as the
-- recording statement found it). at is the database's clock. Rows are
-- deleted with the audit's retention (Store.PruneRefusals).
--
-- reap_decisions.holder: the replica that wrote a decision (its leader
-- identity, board.Options.Holder); NULL for the rows before this
-- migration, and for a writer that has none (a tool).
--
-- Additive: a binary of schema 19 neither reads nor writes either.
CREATE TABLE fence_refusals (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    write           text        NOT NULL,
    term            bigint      NOT NULL,
    holder          text        NOT NULL DEFAULT '',
    write_at        timestamptz,
    attempts        jsonb       NOT NULL DEFAULT '[]',
    requests        integer     NOT NULL DEFAULT 0
        CONSTRAINT fence_refusals_requests_check CHECK (requests >= 0),
    lead_term       bigint,
    lead_holder     text,
    lead_expires_at timestamptz
);
CREATE INDEX fence_refusals_at_idx ON fence_refusals (at);

ALTER TABLE reap_decisions ADD COLUMN holder text;
