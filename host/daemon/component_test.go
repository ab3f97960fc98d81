package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeComponent runs until its context ends, or returns at once when
// early is set.
type fakeComponent struct {
	leader bool
	early  error
	stop   error // what it returns once ctx is done
}

func (f fakeComponent) NeedsLeadership() bool { return f.leader }

func (f fakeComponent) Run(ctx context.Context) error {
	if f.early != nil {
		return f.early
	}
	<-ctx.Done()
	return f.stop
}

// A component that stops while reaperd runs stops reaperd with its error;
// one that returns at the end is only reported, and every one's result
// reaches the channel before it closes.
func TestComponentsThatStopOnTheirOwnAreFatal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	fatal := make(chan error, 4)
	broken := errors.New("listener gone")
	done := components{
		{"steady", fakeComponent{leader: true}},
		{"broken", fakeComponent{early: broken}},
		{"closing", fakeComponent{stop: errors.New("closed badly")}},
	}.start(ctx, func(err error) { fatal <- err })
	err := <-fatal
	if !errors.Is(err, broken) || !strings.HasPrefix(err.Error(), "broken: ") {
		t.Fatalf("fatal %v, want the broken component's error named", err)
	}
	cancel()
	got := map[string]error{}
	for r := range done {
		got[r.name] = r.err
	}
	if len(got) != 3 || got["steady"] != nil || !errors.Is(got["broken"], broken) || got["closing"] == nil {
		t.Fatalf("results %v", got)
	}
	select {
	case err := <-fatal:
		t.Fatalf("a component that returned after the stop was fatal: %v", err)
	default:
	}
}

// A component that returns nil while reaperd runs is fatal too: nothing
// of reaperd's may stop unseen.
func TestAComponentReturningNilEarlyIsFatal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fatal := make(chan error, 1)
	quits := components{{"quitter", quitter{}}}.start(ctx, func(err error) { fatal <- err })
	if err := <-fatal; err == nil || !strings.Contains(err.Error(), "quitter stopped on its own") {
		t.Fatalf("fatal %v", err)
	}
	<-quits
}

type quitter struct{}

func (quitter) NeedsLeadership() bool         { return false }
func (quitter) Run(ctx context.Context) error { return nil }
