-- The attempt's credential, as the attempt API saw it.
--
-- credential_minted_at: when the runner minted the attempt's first token
-- (at dispatch); the credential ceiling and start_expired count from it.
-- credential_renewed_at: the last heartbeat that was answered with a
-- renewed token. credential_capped_at: the first heartbeat refused a
-- renewal because the credential had reached
-- auth.max_attempt_credential_lifetime; from then on the last token runs out
-- on its own. Every rail that starts a new execution clears all three.
ALTER TABLE task_instances
    ADD COLUMN credential_minted_at  timestamptz,
    ADD COLUMN credential_renewed_at timestamptz,
    ADD COLUMN credential_capped_at  timestamptz;
