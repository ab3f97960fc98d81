package httplimit

import (
	"sync"
	"time"
)

// Buckets are token buckets by key: each key may take n tokens per period,
// and hold at most n (a quiet key's burst). A key whose bucket has refilled
// is forgotten, so the map holds only the keys busy within the last period.
// Time is the caller's: a test moves it.
type Buckets struct {
	n      float64
	period time.Duration

	mu     sync.Mutex
	keys   map[string]*bucket
	pruned time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewBuckets is buckets of n tokens per period.
func NewBuckets(n int, period time.Duration) *Buckets {
	return &Buckets{n: float64(n), period: period, keys: map[string]*bucket{}}
}

// Take takes one token of key's bucket at now, and reports whether there
// was one.
func (b *Buckets) Take(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.pruned) >= b.period {
		b.prune(now)
	}
	k, ok := b.keys[key]
	if !ok {
		k = &bucket{tokens: b.n, at: now}
		b.keys[key] = k
	}
	if d := now.Sub(k.at); d > 0 {
		k.tokens = min(b.n, k.tokens+b.n*float64(d)/float64(b.period))
		k.at = now
	}
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}

// prune forgets the keys whose bucket is full again at now.
func (b *Buckets) prune(now time.Time) {
	for key, k := range b.keys {
		if now.Sub(k.at) >= b.period {
			delete(b.keys, key)
		}
	}
	b.pruned = now
}

// Len is how many keys are remembered.
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.keys)
}

// InFlight counts the requests in progress by key, at most n each.
type InFlight struct {
	n    int
	mu   sync.Mutex
	keys map[string]int
}

// NewInFlight bounds each key to n requests at once.
func NewInFlight(n int) *InFlight { return &InFlight{n: n, keys: map[string]int{}} }

// Acquire takes one of key's places, and reports whether one was free;
// release it with Release.
func (f *InFlight) Acquire(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys[key] >= f.n {
		return false
	}
	f.keys[key]++
	return true
}

// Release gives back a place Acquire took.
func (f *InFlight) Release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys[key]--; f.keys[key] <= 0 {
		delete(f.keys, key)
	}
}
