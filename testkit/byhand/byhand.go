// Package byhand holds what the host's maintenance cycle and its services
// read that a test moves by hand: a leadership (Lead) and a supervised
// plugin or substrate that never restarts (Static).
package byhand

import (
	"context"
	"sync"
	"time"

	"github.com/dexaflow/reaper/host/leader"
)

// Lead is a leadership whose status the test sets; the zero Lead does not
// lead. Safe for concurrent use.
type Lead struct {
	mu sync.Mutex
	st leader.Status
}

// NewLead returns a Lead with status st.
func NewLead(st leader.Status) *Lead { return &Lead{st: st} }

// Status is the status last set, whatever the time.
func (l *Lead) Status(time.Time) leader.Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// Set makes st the status.
func (l *Lead) Set(st leader.Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st = st
}

// Static is a supervised value that never restarts: Get answers V and
// Err, Down answers IsDown, and Recycle counts its calls in Recycled. Not
// safe for concurrent use of its fields.
type Static[T any] struct {
	V        T
	Err      error
	IsDown   bool
	Recycled int
}

// Get answers V and Err.
func (s *Static[T]) Get(context.Context, time.Time) (T, error) { return s.V, s.Err }

// Down answers IsDown.
func (s *Static[T]) Down() bool { return s.IsDown }

// Recycle counts the call.
func (s *Static[T]) Recycle() { s.Recycled++ }
