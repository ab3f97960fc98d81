package steps

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
)

// recoveryJitter is how far each refill strays from the rate, either way:
// two runners, or two pools, refilled on the same tick do not admit in
// lockstep.
const recoveryJitter = 0.2

// Recovery is the recovery budget: a token bucket per pool that every
// recovery dispatch (IsRecovery: a retry, an infra re-place, any new
// execution of a task that ran before) spends one token of, so that after
// a mass loss the re-placed attempts reach the executor at a bounded rate
// and the first attempts of live work, which spend nothing, keep their
// share of the slots. A recovery dispatch the budget refuses stays
// scheduled, which keeps its run alive, for a later cycle. It lives as long
// as its runner (the buckets carry over from cycle to cycle) and is safe
// for concurrent use.
type Recovery struct {
	mu       sync.Mutex
	rate     map[string]float64 // by pool; absent: the default
	burst    map[string]int
	defRate  float64 // <= 0: unbounded
	defBurst int
	buckets  map[string]*bucket
	rng      *rand.Rand
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewRecovery makes the recovery budget b.
func NewRecovery(b lifecycle.RecoveryBudget) *Recovery {
	r := &Recovery{rate: map[string]float64{}, burst: map[string]int{}, defRate: b.Default.Rate,
		defBurst: b.Default.Burst, buckets: map[string]*bucket{}, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	for name, l := range b.Pools {
		r.rate[name], r.burst[name] = l.Rate, l.Burst
	}
	return r
}

func (r *Recovery) limit(pool string) (float64, float64) {
	rate, ok := r.rate[pool]
	burst := r.burst[pool]
	if !ok {
		rate, burst = r.defRate, r.defBurst
	}
	if burst <= 0 {
		burst = max(int(rate), 1)
	}
	return rate, float64(burst)
}

// refill brings pool's bucket to now; a new bucket starts full.
func (r *Recovery) refill(pool string, now time.Time) (*bucket, bool) {
	rate, burst := r.limit(pool)
	if rate <= 0 {
		return nil, false
	}
	b, ok := r.buckets[pool]
	if !ok {
		b = &bucket{tokens: burst, at: now}
		r.buckets[pool] = b
		return b, true
	}
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		jitter := 1 + recoveryJitter*(2*r.rng.Float64()-1)
		b.tokens = min(burst, b.tokens+dt*rate*jitter)
		b.at = now
	}
	return b, true
}

// Admit spends one of pool's tokens at now, if it has one; an unbounded
// pool always admits.
func (r *Recovery) Admit(pool string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, bounded := r.refill(pool, now)
	if !bounded {
		return true
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Spent reports whether pool has no token at now: its recovery dispatches
// are left out of the listing.
func (r *Recovery) Spent(pool string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, bounded := r.refill(pool, now)
	return bounded && b.tokens < 1
}

// IsRecovery tells a recovery dispatch from a task's first: a later try
// (a retry) or a later execution of a try (an infra re-place, a re-offer
// after a failed create, a warm requeue).
func IsRecovery(ti board.TaskInstance) bool { return ti.Try > 1 || ti.Epoch > 0 }

// recoveryPool is the pool a task's recovery is counted in.
func recoveryPool(ti board.TaskInstance) string {
	if ti.Pool == "" {
		return lifecycle.DefaultPool
	}
	return ti.Pool
}
