package audit

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

// MaxOwedDecisions bounds the decisions a Recorder keeps for the audit
// while its writes fail (the database down, say); past it the oldest are
// given up, with an error naming how many.
const MaxOwedDecisions = 100_000

// Recorder writes decisions to the audit and keeps what a failed write
// left out of it: the decisions still to write, oldest first, written again
// in order at the next Retry (the host's next cycle), up to
// MaxOwedDecisions. It is the audit's one queue of retries: a caller hands
// each decision over once, by Record or through a pass's Sink (Finish),
// and reads what came of it. It is safe for concurrent use.
type Recorder struct {
	w   Writer // nil: nothing is written, nothing kept
	log hclog.Logger

	mu   sync.Mutex
	owed []owedBatch // oldest first
	n    int         // the decisions in owed
}

// owedBatch is a batch of decisions the audit still lacks, with the term
// and the time they are to be written under.
type owedBatch struct {
	term int64
	at   time.Time
	ds   []sdk.Decision
}

// Outcome says what became of decisions handed to a Recorder.
type Outcome struct {
	// Written is how many of them are in the audit now.
	Written int
	// Owed is how many decisions the Recorder keeps for its next Retry once
	// the call returned: what this call failed to write and what was kept
	// from before.
	Owed int
	// Dropped is how many decisions kept from before were given up during
	// the call, past MaxOwedDecisions: they will never be audited.
	Dropped int
	// Err is the failed write's error, if a write failed.
	Err error
}

// NewRecorder returns the recorder of the decisions written through w,
// logging what it keeps, retries and gives up to log. A nil w writes and
// keeps nothing.
func NewRecorder(w Writer, log hclog.Logger) *Recorder {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Recorder{w: w, log: log}
}

// Record writes ds to the audit as one batch under term and at, bounded by
// Bound, its write outliving ctx's cancellation; what the write fails to
// put there is kept for the next Retry.
func (r *Recorder) Record(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) Outcome {
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
	return r.outcome(Outcome{Written: len(ds) - len(unwritten), Dropped: r.owe(term, at, unwritten), Err: err})
}

// Finish waits for a pass's sink, which writes through the Recorder's
// Writer, to be done (Sink.Wait), and keeps what its failed writes left
// out of the audit for the next Retry, as one batch under the sink's term
// and time. The sink's decisions, when it kept them, are still Wait's.
func (r *Recorder) Finish(s *Sink) Outcome {
	_, err := s.Wait()
	written := s.Written()
	if err == nil {
		return r.outcome(Outcome{Written: written})
	}
	unwritten := s.Unwritten()
	r.log.Warn("audit of decisions failed: kept for the next cycle", "count", len(unwritten), "error", err)
	return r.outcome(Outcome{Written: written, Dropped: r.owe(s.term, s.at, unwritten), Err: err})
}

// Retry writes what the audit still lacks, oldest first, each batch under
// its own term and time whoever leads now, and keeps what still fails with
// all that comes after it, for the next Retry.
func (r *Recorder) Retry(ctx context.Context) Outcome {
	r.mu.Lock()
	owed := r.owed
	r.owed, r.n = nil, 0
	r.mu.Unlock()
	var out Outcome
	for i, o := range owed {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Bound(len(o.ds)))
		err := r.w.RecordDecisions(actx, o.term, o.at, o.ds)
		cancel()
		if err != nil {
			r.log.Warn("audit of decisions kept from before failed again", "count", len(o.ds), "error", err)
			unwritten := Unwritten(o.ds, err)
			out.Written += len(o.ds) - len(unwritten)
			out.Err = err
			out.Dropped += r.owe(o.term, o.at, unwritten)
			for _, rest := range owed[i+1:] {
				out.Dropped += r.owe(rest.term, rest.at, rest.ds)
			}
			return r.outcome(out)
		}
		r.log.Info("decisions kept from before are in the audit now", "count", len(o.ds), "term", o.term)
		out.Written += len(o.ds)
	}
	return r.outcome(out)
}

// owe keeps ds for Retry; past MaxOwedDecisions the oldest batches are
// given up (never the one just kept). It returns how many decisions were.
func (r *Recorder) owe(term int64, at time.Time, ds []sdk.Decision) (dropped int) {
	if len(ds) == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owed = append(r.owed, owedBatch{term: term, at: at, ds: ds})
	r.n += len(ds)
	for r.n > MaxOwedDecisions && len(r.owed) > 1 {
		r.log.Error("audit writes kept failing: decisions given up, never audited",
			"count", len(r.owed[0].ds), "term", r.owed[0].term, "at", r.owed[0].at)
		dropped += len(r.owed[0].ds)
		r.n -= len(r.owed[0].ds)
		r.owed = r.owed[1:]
	}
	return dropped
}

// outcome completes out with what the Recorder keeps now.
func (r *Recorder) outcome(out Outcome) Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	out.Owed = r.n
	return out
}
