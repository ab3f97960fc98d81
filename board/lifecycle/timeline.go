package lifecycle

import (
	"context"
	"fmt"
)

// Timeline is the board database's current WAL timeline. PostgreSQL starts
// a new timeline at every promotion of a standby, so a change between two
// reads says the board failed over in between, and, with asynchronous
// replication, may have lost the last writes it had acknowledged: a
// dispatch among them leaves a pod the promoted board does not know
// (runner/kuberunner ghost.go). The timeline is read from the name of the
// WAL segment being written (its first eight hex digits), which moves to
// the new timeline the moment the promotion ends; pg_control_checkpoint()'s
// moves only at the next checkpoint, and is not everyone's to call. A
// standby cannot answer (it writes no WAL): the board is read on the
// primary.
func (w *Writer) Timeline(ctx context.Context) (int64, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var tl int64
	if err := w.pool.QueryRow(ctx,
		`SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tl); err != nil {
		return 0, fmt.Errorf("reading the board's WAL timeline: %w", err)
	}
	return tl, nil
}
