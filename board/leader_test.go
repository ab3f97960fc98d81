package board_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestLeadership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ttl := 15 * time.Second
	newStore := func(t *testing.T) *board.Store {
		return board.New(pgtest.NewDB(t), board.Options{})
	}
	acquire := func(t *testing.T, s *board.Store, holder string, now time.Time) (board.Lease, bool) {
		t.Helper()
		l, ok, err := s.TryAcquire(ctx, holder, ttl, now)
		if err != nil {
			t.Fatal(err)
		}
		return l, ok
	}

	t.Run("FirstAcquireStartsTermOne", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		l, ok := acquire(t, s, "a", base)
		if !ok || l.Term != 1 || l.Holder != "a" || !l.ExpiresAt.Equal(base.Add(ttl)) || !l.Held(base) {
			t.Fatalf("lease %+v ok=%v", l, ok)
		}
	})

	t.Run("HeldLeaseIsNotTakenOver", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		acquire(t, s, "a", base)
		l, ok := acquire(t, s, "b", base.Add(ttl-time.Millisecond))
		if ok || l.Holder != "a" || l.Term != 1 {
			t.Fatalf("b took a held lease: %+v ok=%v", l, ok)
		}
		// Nor by its own holder: it renews instead.
		if _, ok := acquire(t, s, "a", base.Add(time.Second)); ok {
			t.Fatal("a holder acquired its own running lease again")
		}
	})

	t.Run("ExpiredLeaseIsTakenOverWithTheNextTerm", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		acquire(t, s, "a", base)
		l, ok := acquire(t, s, "b", base.Add(ttl))
		if !ok || l.Holder != "b" || l.Term != 2 || !l.AcquiredAt.Equal(base.Add(ttl)) {
			t.Fatalf("takeover of an expired lease: %+v ok=%v", l, ok)
		}
	})

	t.Run("RenewExtendsOnlyItsOwnTerm", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		a, _ := acquire(t, s, "a", base)
		l, ok, err := s.Renew(ctx, a.Term, "a", ttl, base.Add(10*time.Second))
		if err != nil || !ok || !l.ExpiresAt.Equal(base.Add(25*time.Second)) || l.Term != a.Term {
			t.Fatalf("renew: %+v %v %v", l, ok, err)
		}
		for name, renew := range map[string]func() (board.Lease, bool, error){
			"OtherHolder": func() (board.Lease, bool, error) { return s.Renew(ctx, a.Term, "b", ttl, base.Add(11*time.Second)) },
			"OtherTerm":   func() (board.Lease, bool, error) { return s.Renew(ctx, a.Term+1, "a", ttl, base.Add(11*time.Second)) },
			"Lapsed":      func() (board.Lease, bool, error) { return s.Renew(ctx, a.Term, "a", ttl, base.Add(25*time.Second)) },
		} {
			if _, ok, err := renew(); err != nil || ok {
				t.Fatalf("%s: renewed (ok=%v err=%v)", name, ok, err)
			}
		}
		// After a takeover the old holder cannot renew either.
		b, ok := acquire(t, s, "b", base.Add(26*time.Second))
		if !ok {
			t.Fatal("takeover failed")
		}
		if _, ok, _ := s.Renew(ctx, a.Term, "a", ttl, base.Add(26*time.Second)); ok {
			t.Fatal("a deposed holder renewed")
		}
		cur, found, err := s.CurrentLeader(ctx)
		if err != nil || !found || cur.Term != b.Term || cur.Holder != "b" {
			t.Fatalf("current leader %+v %v %v", cur, found, err)
		}
	})

	t.Run("ResignOfAnyTermFreesOnlyTheHoldersLease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		acquire(t, s, "a", base)
		if ok, err := s.Resign(ctx, 0, "b"); err != nil || ok {
			t.Fatalf("b resigned a's lease: %v %v", ok, err)
		}
		if ok, err := s.Resign(ctx, 0, "a"); err != nil || !ok {
			t.Fatalf("resign of whatever a holds: %v %v", ok, err)
		}
		if cur, _, err := s.CurrentLeader(ctx); err != nil || cur.Held(base) {
			t.Fatalf("the lease still reads held: %+v %v", cur, err)
		}
	})

	t.Run("ResignFreesTheLeaseForTheNextTerm", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		a, _ := acquire(t, s, "a", base)
		if ok, err := s.Resign(ctx, a.Term, "b"); err != nil || ok {
			t.Fatalf("b resigned a's lease: %v %v", ok, err)
		}
		if ok, err := s.Resign(ctx, a.Term, "a"); err != nil || !ok {
			t.Fatalf("resign: %v %v", ok, err)
		}
		cur, _, err := s.CurrentLeader(ctx)
		if err != nil || cur.Held(base) {
			t.Fatalf("a resigned lease still reads held: %+v %v", cur, err)
		}
		l, ok := acquire(t, s, "b", base.Add(time.Second))
		if !ok || l.Term != 2 {
			t.Fatalf("acquire after resign: %+v %v", l, ok)
		}
	})

	t.Run("NoLeaderYet", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		if _, found, err := s.CurrentLeader(ctx); err != nil || found {
			t.Fatalf("found=%v err=%v on an empty board", found, err)
		}
	})
}
