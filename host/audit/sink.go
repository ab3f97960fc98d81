// Package audit is the host's audit of decisions, written through a Writer
// (board.Store in production). Its Pipeline (pipeline.go) is the one way
// every producer's decisions take (the maintenance loop, the owed
// teardowns' retries, the runners, the attempt API): metered, logged,
// audited and retried. Its parts: the sink of a pass (Sink), which writes
// its decisions while the pass goes on; the ledger of a pass's writes
// (Ledger), so that no applied write goes without its decision, wired to
// the sink by Pipeline.NewPass; the Retrier, which keeps what any failed
// write left out of the audit, writing it again at the next cycle; and the
// Scorer (shadow.go), which writes beside a shadow decision (a dry run, a
// hold, a provisional kube mark) the verdict of what became of its
// attempt.
package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Writer keeps decision audit rows.
type Writer interface {
	RecordDecisions(ctx context.Context, term int64, at time.Time, ds []sdk.Decision) error
}

// per is how many decisions the audit gets 10s to write (the board's chunk,
// board.AuditChunk).
const per = 5_000

// Bound is the time a write of n decisions to the audit gets: 10s for every
// 5,000 of them (the board copies them in chunks of that size, each under
// its own query timeout), so a mass recovery's audit is written whole, not
// cut off by a bound sized for one page.
func Bound(n int) time.Duration {
	return time.Duration((n+per-1)/per) * 10 * time.Second
}

// Sink is the sink of one pass. It keeps every decision the pass
// records (stamped with the reaper's name and, in a dry run, as not
// applied) and writes them to the audit while the pass goes on: the first
// batch at once, on a goroutine of its own, and whatever arrives during a
// write in the next one, in order. The marks never wait for the audit; the
// pass is done only once Wait has seen every decision written (or its write
// fail). A failed write does not stop the pass, nor the writes after it:
// Wait returns it. A sink that streams (Stream) hands each batch on once
// written instead of keeping it, so that a mass recovery's decisions are
// never all held at once.
type Sink struct {
	w    Writer // nil: decisions are only kept
	ctx  context.Context
	term int64
	at   time.Time
	name string
	dry  bool
	// allowed are the labels the pass's plugin declared (Only; nil: any).
	allowed map[string]bool

	wg        sync.WaitGroup
	mu        sync.Mutex
	stream    func([]sdk.Decision) // nil: every decision is kept in all
	all       []sdk.Decision
	queue     []sdk.Decision
	writing   bool
	errs      []error
	written   int            // the decisions in the audit
	unwritten []sdk.Decision // what failed writes left out of the audit
}

var _ sdk.Sink = (*Sink)(nil)

// NewSink starts the sink of a pass of the named reaper, whose
// decisions are audited under term at the pass's time at. Its writes outlive
// ctx's cancellation (a pass's deadline must not lose its audit) but keep
// its values.
func NewSink(ctx context.Context, w Writer, term int64, at time.Time, name string, dry bool) *Sink {
	return &Sink{w: w, ctx: context.WithoutCancel(ctx), term: term, at: at, name: name, dry: dry}
}

// Stream makes the sink hand every batch of decisions, once its write is
// over (written or failed), to fn instead of keeping it: in the order
// recorded, one batch at a time, on the sink's writer goroutine (on the
// caller's, in Record, for a sink without a Writer). Wait then returns no
// decisions, only once fn has seen them all, and stops the stream: fn
// sees nothing recorded after Wait. Call it before the first Record.
func (s *Sink) Stream(fn func(ds []sdk.Decision)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream = fn
}

// Only makes the sink take a decision only under one of allowed (the
// labels the pass's plugin declared, sdk.AllowedLabels): any other is
// refused (Screen). Call it before the first Record.
func (s *Sink) Only(allowed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allowed = allowed
}

// Evidence keys of a decision the sink refused: what the plugin asked.
const (
	EvAskedReaper = "asked_reaper"
	EvAskedLabel  = "asked_label"
)

// Refused says which of the sink's refusals d is, if any: a plugin's
// decision the host would not take as it came.
func Refused(d sdk.Decision) bool {
	return d.Label == sdk.LabelBoardRefusedForeignReaper || d.Label == sdk.LabelBoardRefusedUndeclaredLabel
}

// Screen returns ds as the audit takes them from the plugin named name
// (in place): each under name, in a dry run never applied; or, for a
// decision under another reaper's name or a label outside allowed (nil:
// any), the refusal that takes its place, not applied, with what was asked
// as its evidence (clipped: it is the plugin's text).
func Screen(ds []sdk.Decision, name string, allowed map[string]bool, dry bool) []sdk.Decision {
	for i, d := range ds {
		label, refusal := "", ""
		switch {
		case d.Reaper != "" && d.Reaper != name:
			label, refusal = sdk.LabelBoardRefusedForeignReaper, "foreign_reaper"
		case allowed != nil && !allowed[d.Label]:
			label, refusal = sdk.LabelBoardRefusedUndeclaredLabel, "undeclared_label"
		}
		if label != "" {
			d = sdk.Decision{Label: label, Attempt: d.Attempt,
				Detail:   "a decision the host does not take from this plugin: not audited nor metered as asked",
				Evidence: map[string]string{EvRefusal: refusal, EvAskedReaper: clip(d.Reaper), EvAskedLabel: clip(d.Label)}}
		}
		d.Reaper = name
		if dry {
			d.DryRun, d.Applied = true, false
		}
		ds[i] = d
	}
	return ds
}

// clipAt bounds the plugin's words a refusal's evidence repeats.
const clipAt = 128

func clip(v string) string {
	if len(v) <= clipAt {
		return v
	}
	return strings.ToValidUTF8(v[:clipAt], "") + "…"
}

// Record keeps ds and queues them for the audit. It never fails: an audit
// that cannot be written is the host's trouble, not the pass's (Wait says
// so). A decision the host does not take as it came is replaced by its
// refusal (Screen).
func (s *Sink) Record(_ context.Context, ds []sdk.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	s.mu.Lock()
	allowed := s.allowed
	s.mu.Unlock()
	batch := Screen(append([]sdk.Decision(nil), ds...), s.name, allowed, s.dry)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stream == nil {
		s.all = append(s.all, batch...)
	}
	if s.w == nil {
		if s.stream != nil {
			s.stream(batch)
		}
		return nil
	}
	s.queue = append(s.queue, batch...)
	if !s.writing {
		s.writing = true
		s.wg.Add(1)
		go s.write()
	}
	return nil
}

// write writes what is queued, batch after batch, until the queue is empty.
func (s *Sink) write() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		batch, stream := s.queue, s.stream
		s.queue = nil
		if len(batch) == 0 {
			s.writing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(s.ctx, Bound(len(batch)))
		err := s.w.RecordDecisions(ctx, s.term, s.at, batch)
		cancel()
		s.mu.Lock()
		if err != nil {
			left := Unwritten(batch, err)
			s.errs = append(s.errs, fmt.Errorf("audit %d decisions: %w", len(batch), err))
			s.unwritten = append(s.unwritten, left...)
			s.written += len(batch) - len(left)
		} else {
			s.written += len(batch)
		}
		s.mu.Unlock()
		if stream != nil {
			stream(batch)
		}
	}
}

// Wait waits until every decision recorded so far is written to the audit
// (or its write failed) and returns them all, in the order recorded (none
// for a sink that streams, once its stream has seen them all), with the
// failed writes, if any.
func (s *Sink) Wait() ([]sdk.Decision, error) {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Whoever streamed is done with the pass: a decision recorded after
	// Wait (a plugin that kept the sink past its pass) is written and kept,
	// never handed to it.
	s.stream = nil
	return s.all[:len(s.all):len(s.all)], errors.Join(s.errs...)
}

// Unwritten returns what the failed writes left out of the audit, in
// order (after Wait): the host owes it to the audit still.
func (s *Sink) Unwritten() []sdk.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unwritten[:len(s.unwritten):len(s.unwritten)]
}

// Written returns how many of the decisions recorded so far are in the
// audit (after Wait).
func (s *Sink) Written() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// Unwritten is the part of batch that a write failing with err left out of
// the audit: all of it, unless err says (an AuditWritten method, as
// board's partial write has) that its first decisions were written.
func Unwritten(batch []sdk.Decision, err error) []sdk.Decision {
	var partial interface{ AuditWritten() int }
	if errors.As(err, &partial) {
		if n := partial.AuditWritten(); n > 0 && n <= len(batch) {
			return batch[n:]
		}
	}
	return batch
}
