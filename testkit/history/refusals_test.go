package history_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/testkit/history"
)

// acquire is the leader row's new term, by its holder.
func acquire(ms int, term int64, holder string) history.Event {
	return w(ms, history.OpAcquire, term, holder, nil, applied, "")
}

// refused is a write the fence refused, with what it met (nil: not known).
func refused(ms int, op string, term int64, holder string, a *history.Attempt, f *history.Fence) history.Event {
	e := w(ms, op, term, holder, a, deposed, "")
	e.Fence = f
	return e
}

// failover: replica-1 leads term 1; replica-2 takes term 2 on the primary,
// which is lost with it; the promoted standby's leader history shows term
// 2 acquired by replica-3. Task a runs and succeeds under it.
func failover(extra ...history.Event) []history.Event {
	h := []history.Event{
		acquire(0, 1, "replica-1"),
		w(5, "set_queued", 1, "replica-1", att("a", 1, 0), applied, "queued"),
		w(6, "report", 0, "", att("a", 1, 0), applied, "running"),
		acquire(50, 2, "replica-3"),
		w(80, "report", 0, "", att("a", 1, 0), applied, "success"),
		final(100, att("a", 1, 0), "success"),
	}
	return append(h, extra...)
}

// A refusal is judged against the leader history: a stale term, a stale
// holder (the term handed out twice), a lease run out or resigned, no
// leader yet: each stale, none a violation. The rightful holder refused,
// with what it met or without, is one, and named.
func TestARefusalMustBeStale(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []history.Event
		want  []history.Rule
	}{
		{
			name: "an older term, after the next began",
			extra: []history.Event{refused(60, "mark", 1, "replica-1", att("a", 1, 0),
				&history.Fence{Term: 2, Holder: "replica-3", Expires: at(90), WriteAt: at(59)})},
		},
		{
			name: "the term's number from another holder (a failover that lost the increment)",
			extra: []history.Event{refused(60, "queue", 2, "replica-2", att("a", 1, 0),
				&history.Fence{Term: 2, Holder: "replica-3", Expires: at(90), WriteAt: at(59)})},
		},
		{
			name:  "a stale holder, the fence's view not recorded",
			extra: []history.Event{refused(60, "prune decisions", 2, "replica-2", nil, nil)},
		},
		{
			name: "the rightful holder past its own lease",
			extra: []history.Event{refused(60, "mark", 2, "replica-3", att("a", 1, 0),
				&history.Fence{Term: 2, Holder: "replica-3", Expires: at(55), WriteAt: at(58)})},
		},
		{
			name:  "the rightful holder after it resigned",
			extra: []history.Event{refused(60, "mark", 2, "replica-3", nil, &history.Fence{Term: 2})},
		},
		{
			name:  "before any term began",
			extra: []history.Event{refused(-10, "mark", 1, "replica-1", nil, &history.Fence{})},
		},
		{
			name: "the rightful holder, its lease running",
			extra: []history.Event{refused(60, "mark", 2, "replica-3", att("a", 1, 0),
				&history.Fence{Term: 2, Holder: "replica-3", Expires: at(90), WriteAt: at(59)})},
			want: []history.Rule{history.RuleRightfulRefused},
		},
		{
			name:  "the rightful holder, what the fence met not recorded",
			extra: []history.Event{refused(60, "append log", 2, "replica-3", nil, nil)},
			want:  []history.Rule{history.RuleRightfulRefused},
		},
		{
			// The leader history is the judge: a fence that says another
			// holder led, where the history shows none taking over, is
			// not believed.
			name: "the rightful holder, the fence naming a holder the history never saw",
			extra: []history.Event{refused(60, "mark", 2, "replica-3", nil,
				&history.Fence{Term: 2, Holder: "replica-9", Expires: at(90), WriteAt: at(59)})},
			want: []history.Rule{history.RuleRightfulRefused},
		},
		{
			name: "the previous leader refused while it still led",
			extra: []history.Event{refused(30, "settle", 1, "replica-1", att("a", 1, 0),
				&history.Fence{Term: 1, Holder: "replica-1", Expires: at(40), WriteAt: at(29)})},
			want: []history.Rule{history.RuleRightfulRefused},
		},
		{
			name:  "refused at the instant a term began: not ordered, not judged",
			extra: []history.Event{refused(50, "mark", 1, "replica-1", nil, nil)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := history.Check(failover(tc.extra...))
			if got := rules(v); !slices.Equal(got, tc.want) {
				t.Fatalf("rules %v, want %v:\n%s", got, tc.want, v)
			}
			if v.RefusedByFence != 1 {
				t.Errorf("refused by the fence: %d, want 1", v.RefusedByFence)
			}
			if len(tc.want) > 0 {
				x := v.Violations[0]
				if !strings.Contains(x.Text, "was refused by the fence") || len(x.Evidence) != 2 ||
					x.Evidence[0].Op != history.OpAcquire || x.Evidence[1].Outcome != history.OutcomeDeposed {
					t.Errorf("the violation: %s, evidence %+v", x, x.Evidence)
				}
			}
		})
	}
}

// A history with no acquisition has no leader history: its refusals are
// counted, not judged (the hand-made clean history refuses a settle so).
func TestRefusalsWithoutALeaderHistoryAreOnlyCounted(t *testing.T) {
	v := history.Check([]history.Event{refused(60, "mark", 2, "replica-3", nil, nil)})
	if !v.OK() || v.RefusedByFence != 1 {
		t.Errorf("%s", v)
	}
}

// A fence on anything but a write the fence refused is malformed; a
// refusal's fence survives the file.
func TestTheFenceInTheFile(t *testing.T) {
	bad := w(10, "mark", 1, "replica-1", nil, applied, "failed")
	bad.Fence = &history.Fence{Term: 1}
	neg := refused(11, "mark", 1, "replica-1", nil, &history.Fence{Term: -1})
	v := history.Check([]history.Event{acquire(0, 1, "replica-1"), bad, neg})
	if got := rules(v); !slices.Equal(got, []history.Rule{history.RuleMalformed, history.RuleMalformed}) {
		t.Fatalf("rules %v:\n%s", got, v)
	}

	e := refused(60, "mark", 2, "replica-2", att("a", 1, 0),
		&history.Fence{Term: 2, Holder: "replica-3", Expires: at(90), WriteAt: at(59)})
	var buf bytes.Buffer
	if err := history.NewWriter(&buf).Record(e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"fence":{"term":2,"holder":"replica-3","expires":"2025-03-04T05:06:07.09Z","write_at":"2025-03-04T05:06:07.059Z"}`) {
		t.Errorf("the line: %s", buf.String())
	}
	back, err := history.Decode(&buf)
	if err != nil || len(back) != 1 || back[0].Fence == nil || *back[0].Fence != *e.Fence {
		t.Fatalf("read back: %+v %v", back, err)
	}
}
