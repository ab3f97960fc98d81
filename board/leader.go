package board

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is the leader row: who holds leadership, under which term, until
// when. Times are the holders' clocks, never the database's.
type Lease struct {
	Name       string
	Term       int64
	Holder     string // empty once resigned
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time // zero once resigned
}

// Held reports whether the lease is held at now.
func (l Lease) Held(now time.Time) bool {
	return l.Holder != "" && !l.ExpiresAt.IsZero() && l.ExpiresAt.After(now)
}

const leaseColumns = "name, term, holder, acquired_at, renewed_at, expires_at"

func scanLease(row pgx.Row) (Lease, error) {
	var (
		l       Lease
		holder  *string
		expires *time.Time
	)
	if err := row.Scan(&l.Name, &l.Term, &holder, &l.AcquiredAt, &l.RenewedAt, &expires); err != nil {
		return Lease{}, err
	}
	l.Holder, l.ExpiresAt = deref(holder), timeOrZero(expires)
	return l, nil
}

// TryAcquire takes leadership for holder when the lease is free (never
// taken, resigned, or expired at now), starting a new term: the previous
// term plus one. It returns the lease and whether holder got it; when not,
// the lease returned is the current one. A holder whose own lease is still
// running does not get a new term: it renews.
func (s *Store) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (Lease, bool, error) {
	if holder == "" || ttl <= 0 || now.IsZero() {
		return Lease{}, false, fmt.Errorf("board: acquire leadership: holder, a positive ttl and now are required")
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	l, err := scanLease(s.pool.QueryRow(ctx, `
INSERT INTO leader (name, term, holder, acquired_at, renewed_at, expires_at)
VALUES ($1, 1, $2, $3, $3, $4)
ON CONFLICT (name) DO UPDATE SET
    term = leader.term + 1, holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at,
    renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at
WHERE leader.holder IS NULL OR leader.expires_at IS NULL OR leader.expires_at <= EXCLUDED.acquired_at
RETURNING `+leaseColumns, s.leader, holder, now, now.Add(ttl)))
	if err == nil {
		return l, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, false, fmt.Errorf("board: acquire leadership: %w", err)
	}
	cur, _, err := s.CurrentLeader(ctx)
	if err != nil {
		return Lease{}, false, fmt.Errorf("board: acquire leadership: %w", err)
	}
	return cur, false, nil
}

// Renew extends holder's lease of term to now+ttl. It succeeds only while
// that term is current, held by holder and not expired at now; a lapsed lease
// is not revived (its holder must acquire again, under a new term).
func (s *Store) Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (Lease, bool, error) {
	if ttl <= 0 || now.IsZero() {
		return Lease{}, false, fmt.Errorf("board: renew leadership: a positive ttl and now are required")
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	l, err := scanLease(s.pool.QueryRow(ctx, `
UPDATE leader SET renewed_at = $4, expires_at = $5
WHERE name = $1 AND term = $2 AND holder = $3 AND expires_at > $4
RETURNING `+leaseColumns, s.leader, term, holder, now, now.Add(ttl)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("board: renew leadership: %w", err)
	}
	return l, true, nil
}

// Resign frees the lease of term if holder still holds it, so a successor
// need not wait for it to expire; term 0 frees whatever term holder holds.
// It reports whether it did.
func (s *Store) Resign(ctx context.Context, term int64, holder string) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `UPDATE leader SET holder = NULL, expires_at = NULL
        WHERE name = $1 AND ($2 = 0 OR term = $2) AND holder = $3`, s.leader, term, holder)
	if err != nil {
		return false, fmt.Errorf("board: resign leadership: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// CurrentLeader returns the lease row and whether there is one. Whether it
// is still held is the caller's to judge against its clock (Lease.Held).
func (s *Store) CurrentLeader(ctx context.Context) (Lease, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	l, err := scanLease(s.pool.QueryRow(ctx, "SELECT "+leaseColumns+" FROM leader WHERE name = $1", s.leader))
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("board: read leader: %w", err)
	}
	return l, true, nil
}
