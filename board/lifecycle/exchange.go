package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/sdk"
)

// Exchange is the answer of ExchangeBootstrap.
type Exchange string

const (
	// Exchanged: the exchange is recorded; the caller may hand out the
	// attempt's working token.
	Exchanged Exchange = "exchanged"
	// ExchangeSpent: the attempt's bootstrap was exchanged already. Nothing
	// changed; the caller refuses (the copy is being replayed).
	ExchangeSpent Exchange = "spent"
	// ExchangeMovedOn: the row no longer holds this queued attempt with this
	// mint (another try or epoch, a later state, a newer mint, a finished
	// run). Nothing changed; the agent must not start.
	ExchangeMovedOn Exchange = "moved_on"
)

// ExchangeBootstrap records the one exchange of the attempt's bootstrap
// credential, minted at mintedAt (the token's claim, to the millisecond the
// token carries): it applies only while the row holds the attempt queued,
// its run running, its recorded mint is that one (or none is recorded: a
// writer that mints without RecordMint) and no exchange is recorded yet. It never changes the mint time, so the credential ceiling
// and start_expired keep counting from the dispatch. When it does not
// apply, nothing changes and the answer says why.
func (w *Writer) ExchangeBootstrap(ctx context.Context, a sdk.Attempt, mintedAt, now time.Time) (Exchange, error) {
	minted := time.UnixMilli(mintedAt.UnixMilli()).UTC()
	ok, err := w.step(ctx, "exchange the bootstrap credential of", a, `UPDATE task_instances ti
        SET credential_exchanged_at = $5, updated_at = $5
        FROM runs r WHERE `+guardAttempt+`
            AND ti.state = 'queued'
            AND ti.credential_exchanged_at IS NULL
            AND (ti.credential_minted_at IS NULL
                OR date_trunc('milliseconds', ti.credential_minted_at) = $6)`, now, minted)
	if err != nil {
		return "", err
	}
	if ok {
		return Exchanged, nil
	}
	ctx, cancel := w.bound(ctx)
	defer cancel()
	var exchanged *time.Time
	err = w.pool.QueryRow(ctx, `SELECT credential_exchanged_at FROM task_instances
        WHERE run_id = $1 AND task_id = $2 AND try_number = $3 AND attempt_epoch = $4`,
		a.RunID, a.TaskID, a.Try, a.Epoch).Scan(&exchanged)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ExchangeMovedOn, nil
	case err != nil:
		return "", fmt.Errorf("board: read the bootstrap exchange of %s: %w", a, err)
	case exchanged != nil:
		return ExchangeSpent, nil
	}
	return ExchangeMovedOn, nil
}

// ExchangeWorkerBootstrap records the one exchange of a warm worker's
// bootstrap credential (the token issued at issuedAt and expiring at
// expiresAt, to the millisecond it carries) at now, and removes the records
// of tokens already expired. It reports false, changing nothing, when that
// token was exchanged already.
func (w *Writer) ExchangeWorkerBootstrap(ctx context.Context, worker string, issuedAt, expiresAt, now time.Time) (bool, error) {
	ctx, cancel := w.bound(ctx)
	defer cancel()
	issued := time.UnixMilli(issuedAt.UnixMilli()).UTC()
	expires := time.UnixMilli(expiresAt.UnixMilli()).UTC()
	var inserted bool
	err := w.pool.QueryRow(ctx, `WITH pruned AS (
            DELETE FROM worker_credential_exchanges WHERE expires_at <= $4 AND NOT (worker = $1 AND issued_at = $2)
        ), ins AS (
            INSERT INTO worker_credential_exchanges (worker, issued_at, expires_at, exchanged_at)
            VALUES ($1, $2, $3, $4) ON CONFLICT (worker, issued_at) DO NOTHING RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM ins)`, worker, issued, expires, now).Scan(&inserted)
	if err != nil {
		return false, fmt.Errorf("board: exchange the bootstrap credential of warm worker %s: %w", worker, err)
	}
	return inserted, nil
}
