// Package kubelease elects the reaping replica through a Kubernetes Lease
// (the coordination.k8s.io object client-go's leaderelection uses, through
// its resourcelock.LeaseLock), fenced by the board's term.
//
// A Lease is a leader.Lease: the host's leader.Elector steps it exactly as
// it steps the board's own lease row, so trust, renewal cadence and the
// settling gate (counted from Status.Since) are the same for both. What
// differs is where the choice is made:
//
//   - TryAcquire takes the Kubernetes Lease the way client-go's elector
//     does (free, released, or not renewed within its duration as this
//     process observed it), then takes a new term from the board. The
//     Kubernetes Lease is no fence: client-go does not promise a single
//     acting leader, and LeaderTransitions does not move when an identity
//     re-acquires. The board's term is the fence: every write of a pass
//     carries it and the database refuses a term that is not current.
//     Until the board grants a term (the deposed leader's row may still be
//     running out) the replica holds the Lease but does not lead.
//   - Renew renews the Kubernetes Lease, then the board's term; losing
//     either ends leadership. After a board call that failed, Renew and
//     TryAcquire ask the board first and renew the Lease only once it
//     answers, so a replica whose board went silent renews the Lease once
//     at most: the Lease runs out about when its term does.
//   - Resign resigns the board's term, then releases the Kubernetes Lease
//     (holder cleared) so a successor need not wait for it to run out. The
//     caller stops every guarded piece of work before it resigns; leader's
//     Elector.Run resigns only once its context is done.
//
// Holding the Lease is worth something only while the board answers: a
// replica that reaches the API server but not the database (a partition,
// a database that stalls for it alone) would otherwise keep the Lease
// renewed for ever while every board call hangs, and no replica would
// lead. So the Lease is held on the board's word. From the moment this
// process takes the Lease, every answer of the board to it (a term, a
// renewal, or a refusal: the board answered) restarts a count; once the
// board has been silent for a whole lease duration (every call erring or
// timing out), the process no longer renews the Lease but releases it,
// and does not take it again for one more lease duration, so a replica
// that reaches both takes it first. By then the silent replica's own term
// has run out on the board (it was last renewed before the silence began),
// so the successor gets its term at once, and the replica that released
// has stopped leading on its own clock before (its trust ends a margin
// short of the lease). A board that answers
// slowly but within a step is not silent: its answers keep the Lease. One
// that answers only now and then keeps it while the gaps stay shorter
// than the lease, and leads when its renewals land. When no replica
// reaches the board, the Lease passes from one to the next every lease
// duration until one does.
//
// Each process needs an identity of its own (Identity): two processes with
// one identity would each believe they hold the Lease.
package kubelease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/dexaflow/reaper/host/leader"
)

// Config names the Lease.
type Config struct {
	// Namespace and Name of the Lease object.
	Namespace string
	Name      string
	// Client reaches the API server; it needs get, create and update on
	// leases in Namespace.
	Client kubernetes.Interface
}

// Lease is a leader.Lease over a Kubernetes Lease, fenced by board's terms.
// It is safe for concurrent use, though the Elector calls it one step at a
// time.
type Lease struct {
	board leader.Lease

	mu   sync.Mutex
	lock *resourcelock.LeaseLock
	// observed is the Lease's record as last read, and observedAt when this
	// process first saw it so (its own clock, as client-go's elector does:
	// another process's clock is never compared with ours).
	observed   []byte
	observedAt time.Time
	// answeredAt is when the board last answered this process, or when
	// this process took the Lease if later: the Lease is released once it
	// is a lease duration old (silent). yieldUntil: after such a release,
	// the Lease is not taken again before it.
	answeredAt time.Time
	yieldUntil time.Time
	// boardFailed: the last call to the board failed (Renew asks it
	// first).
	boardFailed bool
}

var _ leader.Lease = (*Lease)(nil)

// New returns a Lease over cfg's Kubernetes Lease that takes its terms from
// board (the board's lease row).
func New(cfg Config, board leader.Lease) (*Lease, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("kubelease: the Lease's namespace and name are required")
	}
	if cfg.Client == nil || board == nil {
		return nil, errors.New("kubelease: a client and the board's lease are required")
	}
	return &Lease{board: board, lock: &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:    cfg.Client.CoordinationV1(),
	}}, nil
}

// Identity returns an identity unique to this process: the host name and a
// random suffix.
func Identity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "reaperd"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return host + "_" + hex.EncodeToString(b)
}

func seconds(d time.Duration) int {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		return 1
	}
	return int(s)
}

// take takes or renews the Kubernetes Lease for holder at now. It reports
// false when another holder's lease is still running as this process
// observed it.
func (l *Lease) take(ctx context.Context, holder string, ttl time.Duration, now time.Time) (bool, error) {
	rec, raw, err := l.lock.Get(ctx)
	if apierrors.IsNotFound(err) {
		err = l.lock.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: holder,
			LeaseDurationSeconds: seconds(ttl), AcquireTime: metav1.NewTime(now), RenewTime: metav1.NewTime(now)})
		switch {
		case apierrors.IsAlreadyExists(err):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("kubelease: creating Lease %s: %w", l.lock.Describe(), err)
		}
		l.observed, l.observedAt = nil, now
		l.answeredAt = now
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("kubelease: reading Lease %s: %w", l.lock.Describe(), err)
	}
	if string(raw) != string(l.observed) {
		l.observed, l.observedAt = raw, now
	}
	held := rec.HolderIdentity != "" && rec.HolderIdentity != holder &&
		now.Before(l.observedAt.Add(time.Duration(rec.LeaseDurationSeconds)*time.Second))
	if held {
		return false, nil
	}
	if rec.HolderIdentity == holder && l.silent(now, ttl) {
		return false, l.yield(ctx, *rec, ttl, now)
	}
	if rec.HolderIdentity == holder && l.boardFailed {
		return true, nil // held; renewed once the board answers (TryAcquire)
	}
	if rec.HolderIdentity != holder && now.Before(l.yieldUntil) {
		return false, nil
	}
	next := *rec
	if rec.HolderIdentity != holder {
		next.AcquireTime = metav1.NewTime(now)
		next.LeaderTransitions++
	}
	next.HolderIdentity, next.LeaseDurationSeconds, next.RenewTime = holder, seconds(ttl), metav1.NewTime(now)
	if err := l.lock.Update(ctx, next); err != nil {
		if apierrors.IsConflict(err) {
			return false, nil // another replica wrote it first
		}
		return false, fmt.Errorf("kubelease: updating Lease %s: %w", l.lock.Describe(), err)
	}
	if rec.HolderIdentity != holder {
		l.answeredAt = now // a new hold: the board's silence counts from here
	}
	return true, nil
}

// silent reports whether the board has not answered this process for a
// whole lease duration of ttl since it last did or since the Lease was
// taken.
func (l *Lease) silent(now time.Time, ttl time.Duration) bool {
	return !now.Before(l.answeredAt.Add(ttl))
}

// yield gives up the Lease this process holds (record rec) because the
// board has been silent: it releases it (holder cleared) and will not take
// it again for ttl. A release that fails leaves the Lease to run out on
// its own, unrenewed.
func (l *Lease) yield(ctx context.Context, rec resourcelock.LeaderElectionRecord, ttl time.Duration, now time.Time) error {
	l.yieldUntil = now.Add(ttl)
	next := rec
	next.HolderIdentity, next.LeaseDurationSeconds = "", 1
	if err := l.lock.Update(ctx, next); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("kubelease: releasing Lease %s, the board silent since %s: %w", l.lock.Describe(),
			l.answeredAt.Format(time.RFC3339Nano), err)
	}
	return fmt.Errorf("kubelease: the board has not answered since %s (a lease of %s): released Lease %s for a replica that reaches it",
		l.answeredAt.Format(time.RFC3339Nano), ttl, l.lock.Describe())
}

// TryAcquire takes the Kubernetes Lease for holder, then a new term from
// the board. ok is false while another replica holds the Lease, or while
// the board's row is still held (the Lease is then kept, and the next step
// tries the board again), or while the board does not answer (the Lease is
// kept until the board has been silent for a lease, then released with an
// error that says so).
func (l *Lease) TryAcquire(ctx context.Context, holder string, ttl time.Duration, now time.Time) (int64, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// After a board call that failed, a Lease this process holds is not
	// renewed until the board answers (take leaves it as it is).
	unrenewed := l.boardFailed
	ok, err := l.take(ctx, holder, ttl, now)
	if err != nil || !ok {
		return 0, false, err
	}
	term, ok, err := l.board.TryAcquire(ctx, holder, ttl, now)
	l.boardFailed = err != nil
	if err != nil {
		return 0, false, fmt.Errorf("kubelease: taking a term from the board: %w", err)
	}
	l.answeredAt = now
	if ok && unrenewed {
		held, err := l.renewLease(ctx, holder, ttl, now)
		if err != nil || !held {
			// The term is left to run out on the board (the elector
			// resigns what it may hold when it stops).
			return 0, false, errors.Join(err, fmt.Errorf("kubelease: term %d taken, but the Lease %s could not be renewed after it", term, l.lock.Describe()))
		}
	}
	return term, ok, nil
}

// Renew renews the Kubernetes Lease and then the board's term; after a
// board call that failed, the board's term first and the Lease only once
// the board has answered, so that a Lease whose board went silent is
// renewed once at most and runs out with the term. ok is false once
// another replica holds the Lease or the board's term is over.
func (l *Lease) Renew(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.boardFailed {
		if ok, err := l.renewTerm(ctx, term, holder, ttl, now); err != nil || !ok {
			return false, err
		}
		return l.renewLease(ctx, holder, ttl, now)
	}
	if ok, err := l.renewLease(ctx, holder, ttl, now); err != nil || !ok {
		return false, err
	}
	return l.renewTerm(ctx, term, holder, ttl, now)
}

// renewLease renews the Kubernetes Lease for holder; false when another
// holds it. A board silent for a lease releases it instead (yield).
func (l *Lease) renewLease(ctx context.Context, holder string, ttl time.Duration, now time.Time) (bool, error) {
	rec, _, err := l.lock.Get(ctx)
	if err != nil {
		return false, fmt.Errorf("kubelease: reading Lease %s: %w", l.lock.Describe(), err)
	}
	if rec.HolderIdentity != holder {
		return false, nil
	}
	if l.silent(now, ttl) {
		return false, l.yield(ctx, *rec, ttl, now)
	}
	next := *rec
	next.RenewTime, next.LeaseDurationSeconds = metav1.NewTime(now), seconds(ttl)
	if err := l.lock.Update(ctx, next); err != nil {
		return false, fmt.Errorf("kubelease: renewing Lease %s: %w", l.lock.Describe(), err)
	}
	return true, nil
}

// renewTerm renews holder's term on the board, noting whether the board
// answered.
func (l *Lease) renewTerm(ctx context.Context, term int64, holder string, ttl time.Duration, now time.Time) (bool, error) {
	ok, err := l.board.Renew(ctx, term, holder, ttl, now)
	l.boardFailed = err != nil
	if err != nil {
		return false, fmt.Errorf("kubelease: renewing term %d on the board: %w", term, err)
	}
	l.answeredAt = now
	return ok, nil
}

// Resign ends the board's term, then releases the Kubernetes Lease if
// holder still holds it. Every guarded piece of work must have stopped
// before.
func (l *Lease) Resign(ctx context.Context, term int64, holder string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	berr := l.board.Resign(ctx, term, holder)
	if berr != nil {
		berr = fmt.Errorf("kubelease: resigning term %d on the board: %w", term, berr)
	}
	rec, _, err := l.lock.Get(ctx)
	if err != nil {
		return errors.Join(berr, fmt.Errorf("kubelease: reading Lease %s to release it: %w", l.lock.Describe(), err))
	}
	if rec.HolderIdentity != holder {
		return berr
	}
	next := *rec
	next.HolderIdentity, next.LeaseDurationSeconds = "", 1
	if err := l.lock.Update(ctx, next); err != nil {
		return errors.Join(berr, fmt.Errorf("kubelease: releasing Lease %s: %w", l.lock.Describe(), err))
	}
	return berr
}
