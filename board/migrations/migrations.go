// Package migrations holds the board's schema as numbered SQL files,
// embedded in every binary that links the board.
//
// A file is named NNN_name.sql: NNN is its version, applied in ascending
// order, each exactly once. The versions run from 001 without a gap. A
// released file is never edited; a change to the schema is a new file with
// the next number.
//
// # The floor
//
// Each migration applied is recorded with a floor: the oldest schema
// version a binary must know (its newest embedded migration) to run on a
// database whose newest migration is this one. A binary at or above the
// floor runs even on a database that holds newer migrations than it knows;
// one below refuses to start and says which migration raised the floor.
//
// From 019 on, the first line of every file declares how the migration
// moves the floor, in one of two forms:
//
//	-- reaper: additive
//	-- reaper: floor=N
//
// additive keeps the floor where the previous migration left it: use it
// when every binary that ran on the schema before keeps working after it
// (a new table, a new nullable column or one with a default that older
// writers need not fill, a new index, a new function). floor=N raises the
// floor to N (at most the file's own version, and not below the floor
// already in force): binaries older than schema N break on it (a column
// dropped, renamed or made NOT NULL without a default, a constraint older
// writers violate, a meaning changed). floor=NNN with the file's own
// version is the usual breaking migration; a lower N says that the
// binaries from N on already stopped depending on what the migration takes
// away (the contract step of an expand/contract change). When in doubt,
// raise it: a floor set too high only makes a rollback refuse, one set too
// low lets an old binary write a schema it does not understand.
//
// The files before 019 carry no such line: they were applied by binaries
// that required an exact match of versions, and 019 records their floors
// (each raises the floor to itself but for 003, 004 and 015, which only
// add or replace indexes and functions).
//
// # The upgrade probe
//
// A build with the tag reaper_upgrade_probe embeds one more migration,
// probe/upgrade_probe.sql: an additive no-op that tests use to build a
// second release of the same code with one added migration (an upgrade,
// then a rollback across it). It takes the version one past the newest
// file here, so it never needs renumbering; a database migrated by a probe
// build is a test's own and must not meet a later release whose real
// migration has that number. Builds without the tag (the product's) never
// hold it.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
