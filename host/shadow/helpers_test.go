package shadow_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/leader"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// lead is a leadership that tests move by hand.
type lead struct {
	mu sync.Mutex
	st leader.Status
}

func (l *lead) Status(time.Time) leader.Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// static is a Supervised that never restarts.
type static[T any] struct{ v T }

func (s *static[T]) Get(context.Context, time.Time) (T, error) { return s.v, nil }
func (s *static[T]) Down() bool                                { return false }
func (s *static[T]) Recycle()                                  {}
