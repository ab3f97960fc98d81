// Package migrations holds the board's schema as numbered SQL files,
// embedded in every binary that links the board.
//
// A file is named NNN_name.sql: NNN is its version, applied in ascending
// order, each exactly once. A released file is never edited; a change to the
// schema is a new file with the next number.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
