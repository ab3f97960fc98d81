package supervise_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/supervise"
	"github.com/dexaflow/reaper/sdk/clock"
)

type proc struct {
	id     int
	exited bool
	killed bool
}

func (p *proc) Exited() bool { return p.exited }
func (p *proc) Kill()        { p.killed = true }

func TestSupervisor(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := clock.NewFake(t0)
	starts := 0
	var failNext bool
	restarts := 0
	first := &proc{id: 0}
	s := supervise.New(supervise.Config[*proc]{
		Name: "agentlost",
		Start: func(context.Context) (*proc, error) {
			starts++
			if failNext {
				return nil, errors.New("no such binary")
			}
			return &proc{id: starts}, nil
		},
		OnRestart:  func(string) { restarts++ },
		BackoffMin: time.Second, BackoffMax: 8 * time.Second, Clock: c,
	}, first, true, func(p *proc) int { return p.id })
	ctx := context.Background()

	t.Run("RunningProcessIsReturned", func(t *testing.T) {
		if id, err := s.Get(ctx, c.Now()); err != nil || id != 0 || starts != 0 {
			t.Fatalf("id %d err %v starts %d", id, err, starts)
		}
	})
	t.Run("ExitedProcessIsRestarted", func(t *testing.T) {
		first.exited = true
		if !s.Down() {
			t.Fatal("not down")
		}
		id, err := s.Get(ctx, c.Now())
		if err != nil || id != 1 || !first.killed || restarts != 1 {
			t.Fatalf("id %d err %v killed %v restarts %d", id, err, first.killed, restarts)
		}
	})
	t.Run("RecycledProcessIsKilledAndReplacedAtOnce", func(t *testing.T) {
		cur, _ := s.Get(ctx, c.Now())
		s.Recycle()
		if !s.Down() {
			t.Fatal("still up after Recycle")
		}
		id, err := s.Get(ctx, c.Now())
		if err != nil || id != cur+1 {
			t.Fatalf("id %d err %v, want a fresh process", id, err)
		}
	})
	t.Run("FailedStartsBackOff", func(t *testing.T) {
		s.Kill()
		failNext = true
		base := starts
		if _, err := s.Get(ctx, c.Now()); err == nil {
			t.Fatal("start should fail")
		}
		if _, err := s.Get(ctx, c.Now()); err == nil || starts != base+1 {
			t.Fatalf("retried inside the backoff: starts %d err %v", starts, err)
		}
		c.Advance(time.Second)
		s.Get(ctx, c.Now()) // second failure: backoff 2s
		c.Advance(time.Second)
		if s.Get(ctx, c.Now()); starts != base+2 {
			t.Fatalf("starts %d, want %d (still backing off)", starts, base+2)
		}
		failNext = false
		c.Advance(time.Second)
		if id, err := s.Get(ctx, c.Now()); err != nil || id != base+3 {
			t.Fatalf("id %d err %v", id, err)
		}
	})
}
