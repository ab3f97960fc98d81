package history

import (
	"fmt"
	"time"
)

// The fence's refusals judged: a write the fence refused (outcome
// deposed) must have been stale. The leader history is the history's own
// record of the terms (applied writes of OpAcquire: the leader row's new
// term and its holder); a refusal of a write whose term and holder that
// record shows leading at the refusal's time refused the rightful holder
// (RuleRightfulRefused), unless the refusal itself shows that the writer's
// own lease had run out at the write's time or its term was resigned
// (Fence), which the record of acquisitions cannot show.

// OpAcquire is the write that began a term: the leader row's new term,
// under that term, by its holder. The applied ones are the history's
// leader history.
const OpAcquire = "acquire"

// RuleRightfulRefused: a write refused by the fence although its term and
// holder led the board at that moment, by the history's acquisitions, and
// its lease had not run out.
const RuleRightfulRefused Rule = "rightful_holder_refused"

// Fence is what the fence met when it refused a write (a write with
// outcome deposed): the leader row's term, holder and lease expiry as the
// refusal was recorded, and the write's own time, which the lease is
// compared with. A refusal whose Fence shows the writer's own term with
// its lease run out at WriteAt, or resigned, is the lease's refusal.
type Fence struct {
	// Term is the leader row's term; 0: the board had no leader row.
	Term int64 `json:"term,omitempty"`
	// Holder is the leader row's holder; "": none (resigned).
	Holder string `json:"holder,omitempty"`
	// Expires is when the leader row's lease ran out; zero: resigned.
	Expires time.Time `json:"expires,omitzero"`
	// WriteAt is the writer's own time of the write; zero: not known.
	WriteAt time.Time `json:"write_at,omitzero"`
}

// leaseRefusal reports whether the fence shows that the writer of e held
// its term no more by its lease: the row held e's term resigned, or with
// a lease run out at the write's time.
func (f *Fence) leaseRefusal(e Event) bool {
	if f == nil || f.Term != e.Term {
		return false
	}
	if f.Holder == "" || f.Expires.IsZero() {
		return true
	}
	return f.Holder == e.Holder && !f.WriteAt.IsZero() && !f.Expires.After(f.WriteAt)
}

// fenceProblem says why e's Fence cannot be read as evidence, or "".
func fenceProblem(e Event) string {
	switch {
	case e.Fence == nil:
		return ""
	case e.Kind != KindWrite || e.Outcome != OutcomeDeposed:
		return "a fence on an event that is not a write the fence refused"
	case e.Fence.Term < 0:
		return fmt.Sprintf("a fence with a negative term %d", e.Fence.Term)
	}
	return ""
}

// refusals: every write the fence refused was stale by the leader history
// (see RuleRightfulRefused). A history with no acquisition has no leader
// history, and its refusals are only counted.
func (c *checker) refusals() {
	var acquired []indexed // in time order
	for _, w := range c.applied {
		if w.Op == OpAcquire && w.Term > 0 {
			acquired = append(acquired, w)
		}
	}
	if len(acquired) == 0 {
		return
	}
	for _, e := range c.sorted {
		if e.Kind != KindWrite || e.Outcome != OutcomeDeposed || e.Term == 0 || problem(e.Event) != "" {
			continue
		}
		// The leader at the refusal: the last term acquired before it.
		// One acquired at the same instant orders nothing: not judged.
		var lead *indexed
		for i := range acquired {
			if !acquired[i].Time.Before(e.Time) {
				break
			}
			lead = &acquired[i]
		}
		if lead == nil || lead.Term != e.Term || lead.Holder != e.Holder || e.Fence.leaseRefusal(e.Event) {
			continue
		}
		if sameInstant(acquired, e.Time) {
			continue
		}
		met := "nothing of what it met"
		if f := e.Fence; f != nil {
			met = fmt.Sprintf("the leader row at term %d held by %q, its lease to %s, the write's time %s",
				f.Term, f.Holder, ts(f.Expires), ts(f.WriteAt))
		}
		c.violate(RuleRightfulRefused, e.Time, []indexed{*lead, e},
			"%s was refused by the fence at %s, though term %d was %q's from %s (%s) and no later term had begun; the refusal recorded %s",
			write(e.Event), ts(e.Time), lead.Term, lead.Holder, ts(lead.Time), write(lead.Event), met)
	}
}

// sameInstant reports whether a term was acquired at exactly t.
func sameInstant(acquired []indexed, t time.Time) bool {
	for _, a := range acquired {
		if a.Time.Equal(t) {
			return true
		}
	}
	return false
}
