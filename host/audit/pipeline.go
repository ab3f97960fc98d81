package audit

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
)

// Meter counts decisions (host/metrics.Metrics).
type Meter interface {
	Decision(d sdk.Decision)
}

// Pipeline is the host's one way from a decision to the audit, whoever
// made it (the maintenance loop's passes and sweep, the owed teardowns'
// retries, the runners, the attempt API): each decision is metered, logged
// (INFO when applied, DEBUG otherwise) and written to the audit under the
// term and at the time it was decided; what a write fails to put there
// waits in the pipeline's Retrier for the next Retry, still under that term
// and time. Views made by With share the meter, the writer and the
// Retrier, and log to their producer's logger. It is safe for concurrent
// use.
type Pipeline struct {
	w     Writer // nil: nothing is written, nothing kept
	meter Meter  // nil: nothing is metered
	log   hclog.Logger
	retry *Retrier
}

// NewPipeline returns the pipeline writing through w, metering through
// meter and logging to log. A nil w writes and keeps nothing; a nil meter
// meters nothing.
func NewPipeline(w Writer, meter Meter, log hclog.Logger) *Pipeline {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Pipeline{w: w, meter: meter, log: log, retry: NewRetrier(w, log)}
}

// With returns a view of the pipeline that logs decisions to log (a
// producer's own), with the same meter, writer and retries.
func (p *Pipeline) With(log hclog.Logger) *Pipeline {
	if log == nil {
		return p
	}
	v := *p
	v.log = log
	return &v
}

// Record meters and logs ds, decided under term at at, and writes them to
// the audit as one batch (bounded by Bound, outliving ctx's
// cancellation); what the write fails to put there is kept for the next
// Retry.
func (p *Pipeline) Record(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) Outcome {
	if len(ds) == 0 {
		return p.retry.outcome(Outcome{})
	}
	p.note(term, ds)
	return p.retry.Record(ctx, term, at, ds)
}

// Refused records decisions about writes the board or the host refused a
// plugin (Ledger.Refusals) and says so at WARN: a plugin asking for what no
// plugin may do is misbehaving, or hostile.
func (p *Pipeline) Refused(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) Outcome {
	if len(ds) == 0 {
		return p.retry.outcome(Outcome{})
	}
	p.log.Warn("the board refused writes a plugin may not make: nothing of them was written",
		"plugin", ds[0].Reaper, "count", len(ds), "first", ds[0].Label, "run", ds[0].Attempt.RunID,
		"task", ds[0].Attempt.TaskID, "refusal", ds[0].Evidence[EvRefusal])
	return p.Record(ctx, term, at, ds)
}

// Retry writes what the audit still lacks (Retrier.Retry): each batch
// under the term and at the time it was decided, whoever leads now.
func (p *Pipeline) Retry(ctx context.Context) Outcome { return p.retry.Retry(ctx) }

// Screened says at WARN when ds holds decisions the host refused to take
// from the plugin named name as they came (Screen), and returns ds.
func (p *Pipeline) Screened(name string, ds []sdk.Decision) []sdk.Decision {
	n, first := 0, -1
	for i, d := range ds {
		if Refused(d) {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n > 0 {
		ev := ds[first].Evidence
		p.log.Warn("a plugin recorded decisions the host does not take as they came: audited as refusals",
			"plugin", name, "count", n, "first", ds[first].Label, "asked_reaper", ev[EvAskedReaper],
			"asked_label", ev[EvAskedLabel])
	}
	return ds
}

// note meters and logs decisions decided under term.
func (p *Pipeline) note(term int64, ds []sdk.Decision) {
	for _, d := range ds {
		if p.meter != nil {
			p.meter.Decision(d)
		}
		args := []any{"reaper", d.Reaper, "decision", d.Label, "applied", d.Applied, "dry_run", d.DryRun, "term", term}
		if d.Attempt.RunID != "" {
			args = append(args, "run", d.Attempt.RunID)
		}
		if d.Attempt.TaskID != "" {
			args = append(args, "task", d.Attempt.TaskID, "try", d.Attempt.Try, "epoch", d.Attempt.Epoch)
		}
		if d.Detail != "" {
			args = append(args, "detail", d.Detail)
		}
		for k, v := range d.Evidence {
			args = append(args, k, v)
		}
		if d.Applied {
			p.log.Info("decision", args...)
		} else {
			p.log.Debug("decision", args...)
		}
	}
}

// PassSpec says whose pass NewPass starts, and how.
type PassSpec struct {
	// Term and At are the term and the time the pass's decisions are
	// audited under.
	Term int64
	At   time.Time
	// Name is the plugin's (a reaper's, or "substrate" for the sweep):
	// every decision and refusal of the pass is filed under it.
	Name string
	// DryRun makes every decision of the pass not applied.
	DryRun bool
	// Allowed are the labels the plugin declared (sdk.AllowedLabels; nil:
	// any): the sink refuses any other (Sink.Only).
	Allowed map[string]bool
	// Keep is how many of the pass's decisions it keeps for its caller
	// (Pass.Decisions); the rest are only counted.
	Keep int
}

// Pass is the host's edge of one pass: its Sink and its Ledger, wired
// together. Each batch the sink has written (or failed to) is covered in
// the ledger, then metered and logged by the pipeline and let go (but for
// the first Keep): a mass recovery's decisions are never all held. A write
// the ledger refuses after the pass was closed is recorded by the pipeline
// as it comes. Guard and ConfirmDead the Ledger before the pass starts.
type Pass struct {
	Sink   *Sink
	Ledger *Ledger

	p    *Pipeline
	name string
	dry  bool

	mu    sync.Mutex
	keep  int
	kept  []sdk.Decision
	count int
}

// NewPass starts the pass spec describes, over board (the host's board as
// the pass may see it: a dry run's, say). ctx's values (not its
// cancellation) go with its writes.
func (p *Pipeline) NewPass(ctx context.Context, board sdk.Board, spec PassSpec) *Pass {
	ps := &Pass{Sink: NewSink(ctx, p.w, spec.Term, spec.At, spec.Name, spec.DryRun), Ledger: NewLedger(board),
		p: p, name: spec.Name, dry: spec.DryRun, keep: spec.Keep}
	ps.Sink.Only(spec.Allowed)
	late := context.WithoutCancel(ctx)
	ps.Ledger.OnRefusal(spec.Name, func(ds []sdk.Decision) {
		p.Refused(late, spec.Term, spec.At, fill(ds, spec.Name, spec.DryRun))
	})
	ps.Sink.Stream(func(ds []sdk.Decision) {
		ps.Ledger.Cover(ds)
		p.note(spec.Term, p.Screened(spec.Name, ds))
		ps.mu.Lock()
		defer ps.mu.Unlock()
		ps.count += len(ds)
		if room := ps.keep - len(ps.kept); room > 0 {
			ps.kept = append(ps.kept, ds[:min(room, len(ds))]...)
		}
	})
	return ps
}

// Finish ends the pass: it closes the ledger (a later write is refused),
// waits for the sink to be done and keeps what its failed writes left out
// of the audit for the pipeline's next Retry, under the pass's term and
// time.
func (ps *Pass) Finish() Outcome {
	ps.Ledger.Close()
	return ps.p.retry.Finish(ps.Sink)
}

// Refusals returns the refusals of the pass so far (Ledger.Refusals),
// filed under its plugin (fill), and forgets them: call it after Finish
// and hand them to Pipeline.Refused.
func (ps *Pass) Refusals() []sdk.Decision {
	return fill(ps.Ledger.Refusals(), ps.name, ps.dry)
}

// Decisions returns the first Keep decisions of the pass the sink handed
// on, in order, and how many it handed on in all.
func (ps *Pass) Decisions() ([]sdk.Decision, int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.kept[:len(ps.kept):len(ps.kept)], ps.count
}

// fill stamps the plugin's name on decisions that name none, and makes
// sure a dry run's decision never claims to have been applied.
func fill(ds []sdk.Decision, name string, dry bool) []sdk.Decision {
	for i := range ds {
		if ds[i].Reaper == "" {
			ds[i].Reaper = name
		}
		if dry {
			ds[i].DryRun = true
			ds[i].Applied = false
		}
	}
	return ds
}
