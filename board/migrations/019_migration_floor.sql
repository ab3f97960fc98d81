-- reaper: floor=19
-- The migration floor: with each migration applied, the oldest schema
-- version a binary must know to run on a database whose newest migration
-- is that one (see the package documentation of board/migrations). A
-- binary whose newest migration is at or above the floor of the
-- database's newest migration runs on it, even when the database holds
-- newer, additive migrations it does not know; one below refuses to start.
--
-- This migration raises the floor to itself: the binaries before it know
-- no floor and refuse any database but their own version anyway.
--
-- The migrations before this one were applied by binaries that required
-- an exact match of versions. Each is recorded as raising the floor to
-- itself, but for the three that only add or replace what no binary's
-- correctness depends on: 003 (an index), 004 (an index replaced by one of
-- a wider predicate) and 015 (functions for an operator's queries), which
-- keep the floor of the migration before them.
ALTER TABLE schema_migrations ADD COLUMN floor integer;

UPDATE schema_migrations m SET floor = f.floor
FROM (VALUES (1, 1), (2, 2), (3, 2), (4, 2), (5, 5), (6, 6), (7, 7), (8, 8), (9, 9), (10, 10),
             (11, 11), (12, 12), (13, 13), (14, 14), (15, 14), (16, 16), (17, 17), (18, 18)) AS f (version, floor)
WHERE m.version = f.version;

-- Every row has its floor from here on: the binary that applies a
-- migration records it in the same transaction.
ALTER TABLE schema_migrations
    ALTER COLUMN floor SET NOT NULL,
    ADD CONSTRAINT schema_migrations_floor_check CHECK (floor BETWEEN 1 AND version);
