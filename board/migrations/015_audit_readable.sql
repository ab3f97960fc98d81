-- The audit readable from SQL again: reap_evidence(evidence_packed,
-- evidence) is a decision's evidence as jsonb, whichever column holds it
-- (migration 014 writes the compact form; older rows keep jsonb). It costs
-- nothing on the write path: the board never calls it, it is for an
-- operator's query, e.g.
--
--   SELECT id, at, label, reap_evidence(evidence_packed, evidence)
--   FROM reap_decisions WHERE run_id = 'r1' AND task_id = 't1' ORDER BY id;
--
-- The key codes are board/evidence.go's packedKeys, in order (append-only;
-- a test decodes every one of them here against the Go form). A value that
-- is not valid UTF-8 is given in the escape form of encode(); a code this
-- function does not know reads as "#<code>".
-- reap_evidence_uvarint reads the unsigned varint (encoding/binary's
-- form) that starts at byte offset at of packed: its value, and the offset
-- after it. A varint that runs past the end raises get_byte's error.
CREATE FUNCTION reap_evidence_uvarint(packed bytea, at int, OUT value bigint, OUT next int)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    shift int := 0;
    b     int;
BEGIN
    value := 0;
    next := at;
    LOOP
        IF shift > 56 THEN
            RAISE EXCEPTION 'reap_evidence: a varint longer than a length';
        END IF;
        b := get_byte(packed, next);
        next := next + 1;
        value := value | ((b & 127)::bigint << shift);
        EXIT WHEN b < 128;
        shift := shift + 7;
    END LOOP;
END
$$;

CREATE FUNCTION reap_evidence(packed bytea, plain jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    keys CONSTANT text[] := ARRAY[
        'term', 'edition', 'state', 'executor', 'threshold', 'heartbeat_age', 'running_age', 'queued_age',
        'pod_uid', 'activity_age', 'liveness', 'agent', 'group', 'orphan', 'pending', 'liveness_detail',
        'liveness_live', 'signal', 'mark', 'policy', 'noop_reason', 'stop', 'teardown', 'error',
        'attached', 'ceiling', 'brake_judged', 'brake_silence_only', 'brake_allowed', 'brake_share', 'node', 'node_unreachable_since',
        'node_error', 'confirm', 'credential_lapse', 'mark_from_states', 'mark_kind', 'mark_reason', 'message', 'outcome',
        'parked_for', 'warm_workers', 'recovered', 'refusal', 'requests', 'run_age', 'warm_worker', 'write',
        'infra_mark', 'hold', 'why', 'worker', 'pod', 'attempt'];
    out   jsonb := '{}';
    n     int;
    i     int := 1;
    code  bigint;
    len   bigint;
    k     text;
    v     bytea;
    s     text;
BEGIN
    IF packed IS NULL THEN
        RETURN plain;
    END IF;
    n := length(packed);
    IF n = 0 OR get_byte(packed, 0) <> 1 THEN
        RAISE EXCEPTION 'reap_evidence: not the packed evidence of format 1';
    END IF;
    WHILE i < n LOOP
        -- The key: a uvarint code, 0 for a key spelled out.
        SELECT u.value, u.next INTO code, i FROM reap_evidence_uvarint(packed, i) u;
        IF code = 0 THEN
            SELECT u.value, u.next INTO len, i FROM reap_evidence_uvarint(packed, i) u;
            IF i + len > n THEN
                RAISE EXCEPTION 'reap_evidence: packed evidence cut short';
            END IF;
            k := convert_from(substring(packed FROM i + 1 FOR len::int), 'UTF8');
            i := i + len::int;
        ELSIF code <= array_length(keys, 1) THEN
            k := keys[code];
        ELSE
            k := '#' || code;
        END IF;
        -- The value: a uvarint length and its bytes.
        SELECT u.value, u.next INTO len, i FROM reap_evidence_uvarint(packed, i) u;
        IF i + len > n THEN
            RAISE EXCEPTION 'reap_evidence: packed evidence cut short';
        END IF;
        v := substring(packed FROM i + 1 FOR len::int);
        i := i + len::int;
        BEGIN
            s := convert_from(v, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
            s := encode(v, 'escape');
        END;
        out := out || jsonb_build_object(k, s);
    END LOOP;
    RETURN out;
END
$$;
