package sdk

import (
	"context"
	"sync"
)

// Collector is a Sink that keeps every decision it is given, in order: the
// sink of an in-process pass, a test or a benchmark.
type Collector struct {
	mu sync.Mutex
	ds []Decision
}

var _ Sink = (*Collector)(nil)

// Record keeps ds.
func (c *Collector) Record(_ context.Context, ds []Decision) error {
	c.mu.Lock()
	c.ds = append(c.ds, ds...)
	c.mu.Unlock()
	return nil
}

// Decisions returns what was recorded so far.
func (c *Collector) Decisions() []Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ds[:len(c.ds):len(c.ds)]
}

// Reset forgets what was recorded.
func (c *Collector) Reset() {
	c.mu.Lock()
	c.ds = nil
	c.mu.Unlock()
}
