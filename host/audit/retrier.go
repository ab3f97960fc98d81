package audit

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

// MaxPendingDecisions bounds the decisions a Retrier keeps for the audit
// while its writes fail (the database down, say); past it the oldest are
// given up, with an error naming how many.
const MaxPendingDecisions = 100_000

// Retrier writes decisions to the audit and keeps what a failed write
// left out of it: the decisions still to write, oldest first, written again
// in order at the next Retry (the host's next cycle), up to
// MaxPendingDecisions. It is the audit's one queue of retries: a caller hands
// each decision over once, by Record or through a pass's Sink (Finish),
// and reads what came of it. It is safe for concurrent use.
type Retrier struct {
	w   Writer // nil: nothing is written, nothing kept
	log hclog.Logger

	mu      sync.Mutex
	pending []pendingBatch // oldest first
	n       int            // the decisions in pending
}

// pendingBatch is a batch of decisions the audit still lacks, with the term
// and the time they are to be written under.
type pendingBatch struct {
	term int64
	at   time.Time
	ds   []sdk.Decision
}

// Outcome says what became of decisions handed to a Retrier.
type Outcome struct {
	// Written is how many of them are in the audit now.
	Written int
	// Pending is how many decisions the Retrier keeps for its next Retry once
	// the call returned: what this call failed to write and what was kept
	// from before.
	Pending int
	// Dropped is how many decisions kept from before were given up during
	// the call, past MaxPendingDecisions: they will never be audited.
	Dropped int
	// Err is the failed write's error, if a write failed.
	Err error
}

// NewRetrier returns the retrier of the decisions written through w,
// logging what it keeps, retries and gives up to log. A nil w writes and
// keeps nothing.
func NewRetrier(w Writer, log hclog.Logger) *Retrier {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Retrier{w: w, log: log}
}

// Record writes ds to the audit as one batch under term and at, bounded by
// Bound, its write outliving ctx's cancellation; what the write fails to
// put there is kept for the next Retry.
func (r *Retrier) Record(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) Outcome {
	if len(ds) == 0 || r.w == nil {
		return r.outcome(Outcome{})
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Bound(len(ds)))
	defer cancel()
	err := r.w.RecordDecisions(actx, term, at, ds)
	if err == nil {
		return r.outcome(Outcome{Written: len(ds)})
	}
	r.log.Warn("audit of decisions failed: kept for the next cycle", "count", len(ds), "error", err)
	unwritten := Unwritten(ds, err)
	return r.outcome(Outcome{Written: len(ds) - len(unwritten), Dropped: r.keep(term, at, unwritten), Err: err})
}

// Finish waits for a pass's sink, which writes through the Retrier's
// Writer, to be done (Sink.Wait), and keeps what its failed writes left
// out of the audit for the next Retry, as one batch under the sink's term
// and time. The sink's decisions, when it kept them, are still Wait's.
func (r *Retrier) Finish(s *Sink) Outcome {
	_, err := s.Wait()
	written := s.Written()
	if err == nil {
		return r.outcome(Outcome{Written: written})
	}
	unwritten := s.Unwritten()
	r.log.Warn("audit of decisions failed: kept for the next cycle", "count", len(unwritten), "error", err)
	return r.outcome(Outcome{Written: written, Dropped: r.keep(s.term, s.at, unwritten), Err: err})
}

// Retry writes what the audit still lacks, oldest first, each batch under
// its own term and time whoever leads now, and keeps what still fails with
// all that comes after it, for the next Retry.
func (r *Retrier) Retry(ctx context.Context) Outcome {
	r.mu.Lock()
	pending := r.pending
	r.pending, r.n = nil, 0
	r.mu.Unlock()
	var out Outcome
	for i, o := range pending {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Bound(len(o.ds)))
		err := r.w.RecordDecisions(actx, o.term, o.at, o.ds)
		cancel()
		if err != nil {
			r.log.Warn("audit of decisions kept from before failed again", "count", len(o.ds), "error", err)
			unwritten := Unwritten(o.ds, err)
			out.Written += len(o.ds) - len(unwritten)
			out.Err = err
			out.Dropped += r.keep(o.term, o.at, unwritten)
			for _, rest := range pending[i+1:] {
				out.Dropped += r.keep(rest.term, rest.at, rest.ds)
			}
			return r.outcome(out)
		}
		r.log.Info("decisions kept from before are in the audit now", "count", len(o.ds), "term", o.term)
		out.Written += len(o.ds)
	}
	return r.outcome(out)
}

// keep keeps ds for Retry; past MaxPendingDecisions the oldest batches are
// given up (never the one just kept). It returns how many decisions were.
func (r *Retrier) keep(term int64, at time.Time, ds []sdk.Decision) (dropped int) {
	if len(ds) == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, pendingBatch{term: term, at: at, ds: ds})
	r.n += len(ds)
	for r.n > MaxPendingDecisions && len(r.pending) > 1 {
		r.log.Error("audit writes kept failing: decisions given up, never audited",
			"count", len(r.pending[0].ds), "term", r.pending[0].term, "at", r.pending[0].at)
		dropped += len(r.pending[0].ds)
		r.n -= len(r.pending[0].ds)
		r.pending = r.pending[1:]
	}
	return dropped
}

// outcome completes out with what the Retrier keeps now.
func (r *Retrier) outcome(out Outcome) Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	out.Pending = r.n
	return out
}
