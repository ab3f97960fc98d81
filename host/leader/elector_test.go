package leader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/sdk/clock"
)

// lostAnswerLease wins every acquisition but loses its answer: the store
// holds the lease for the holder, the caller hears an error.
type lostAnswerLease struct {
	mu      sync.Mutex
	holder  string
	resigns []int64
}

func (l *lostAnswerLease) TryAcquire(_ context.Context, holder string, _ time.Duration, _ time.Time) (int64, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holder = holder
	return 0, false, errors.New("timeout: context deadline exceeded")
}

func (l *lostAnswerLease) Renew(context.Context, int64, string, time.Duration, time.Time) (bool, error) {
	return false, errors.New("not leading")
}

func (l *lostAnswerLease) Resign(_ context.Context, term int64, holder string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resigns = append(l.resigns, term)
	if holder == l.holder && term == 0 {
		l.holder = ""
	}
	return nil
}

// An acquisition whose answer was lost may have won a term: a replica that
// stops then releases whatever it holds, so no successor waits for the
// lease to expire.
func TestResignReleasesATermWhoseAcquisitionAnswerWasLost(t *testing.T) {
	lease := &lostAnswerLease{}
	e, err := leader.New(lease, leader.Config{Holder: "host/1", Lease: 15 * time.Second,
		Clock: clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))})
	if err != nil {
		t.Fatal(err)
	}
	if st := e.Step(context.Background()); st.Leading {
		t.Fatal("leading after a lost answer")
	}
	e.Resign()
	if lease.holder != "" || len(lease.resigns) != 1 || lease.resigns[0] != 0 {
		t.Fatalf("holder %q after resign, resigns %v", lease.holder, lease.resigns)
	}
	// Nothing uncertain any more: a second stop asks nothing.
	e.Resign()
	if len(lease.resigns) != 1 {
		t.Fatalf("resigns %v", lease.resigns)
	}
}

// grantingLease grants every acquisition a new term and every renewal.
type grantingLease struct{ term int64 }

func (l *grantingLease) TryAcquire(context.Context, string, time.Duration, time.Time) (int64, bool, error) {
	l.term++
	return l.term, true, nil
}

func (l *grantingLease) Renew(context.Context, int64, string, time.Duration, time.Time) (bool, error) {
	return true, nil
}

func (l *grantingLease) Resign(context.Context, int64, string) error { return nil }

// StepDown ends the leadership of the term it names at once, and only of
// that term: a refusal of an older term's write (in flight when this
// replica gained a newer one) changes nothing.
func TestStepDownEndsOnlyTheTermItNames(t *testing.T) {
	e, err := leader.New(&grantingLease{}, leader.Config{Holder: "host/1", Lease: 15 * time.Second,
		Clock: clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))})
	if err != nil {
		t.Fatal(err)
	}
	st := e.Step(context.Background())
	if !st.Leading || st.Term != 1 {
		t.Fatalf("status %+v, want leading term 1", st)
	}
	if e.StepDown(0) || e.StepDown(2) {
		t.Fatal("stepped down for a term it does not lead")
	}
	if !e.StepDown(1) {
		t.Fatal("did not step down for the term it leads")
	}
	if e.Status(time.Date(2030, 1, 1, 0, 0, 1, 0, time.UTC)).Leading {
		t.Fatal("still leading after stepping down")
	}
	if e.StepDown(1) {
		t.Fatal("stepped down twice for one term")
	}
	if st := e.Step(context.Background()); !st.Leading || st.Term != 2 {
		t.Fatalf("after stepping down the next step acquires anew: %+v, want term 2", st)
	}
}
