package sdktest

import (
	"context"
	"testing"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// Rig is one reaper configured on a harness of its own: the fixture a
// reaper plugin's tests arrange rows on (through H) and run passes of R
// with. A plugin's test file needs no harness code of its own:
//
//	type bundle = sdktest.Rig[*Reaper]
//
//	func setup(t testing.TB, edition string, values sdk.Values) *bundle {
//		return sdktest.NewRig(t, edition, New(nil), values)
//	}
type Rig[R sdk.Reaper] struct {
	H *Harness
	R R
}

// NewRig configures r with values (the schema's defaults filling the rest)
// on a new harness of the edition (New). A Configure that fails fails the
// test.
func NewRig[R sdk.Reaper](t testing.TB, edition string, r R, values sdk.Values) *Rig[R] {
	t.Helper()
	h := New(edition)
	if err := h.Configure(context.Background(), r, values); err != nil {
		t.Fatalf("configure: %v", err)
	}
	return &Rig[R]{H: h, R: r}
}

// Reap runs one pass of the rig's reaper (Harness.Reap) and returns its
// decisions. A pass that ends in an error fails the test; a test that
// expects one calls g.H.Reap itself.
func (g *Rig[R]) Reap(t testing.TB) Decisions {
	t.Helper()
	ds, err := g.H.Reap(context.Background(), g.R)
	if err != nil {
		t.Fatalf("reap: %v", err)
	}
	return ds
}

// Rule is one row of a reaper's rule table: Arrange puts one attempt on
// the board (and scripts the substrate), the pass must record Want for it
// and leave its row in WantState; Check, when set, looks further.
type Rule[R sdk.Reaper] struct {
	Name    string
	Edition string // "" is Lite
	Values  sdk.Values
	Arrange func(g *Rig[R]) sdk.Attempt
	// Want is the attempt's decision labels, comma-joined ("" none
	// recorded).
	Want      string
	WantState string
	// WantRun, for a rule about a run (Arrange returns an Attempt with
	// only its RunID), is the run's state after the pass, checked instead
	// of WantState.
	WantRun string
	Check   func(t *testing.T, g *Rig[R], a sdk.Attempt, ds Decisions)
}

// RunRules runs each rule as a parallel subtest, each on a rig of its own
// that setup returns for the rule's edition and values (NewRig around a
// new reaper, or whatever more the plugin's tests need).
func RunRules[R sdk.Reaper](t *testing.T, setup func(t testing.TB, edition string, values sdk.Values) *Rig[R], rules []Rule[R]) {
	t.Helper()
	for _, tc := range rules {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			edition := tc.Edition
			if edition == "" {
				edition = ladder.EditionLite
			}
			g := setup(t, edition, tc.Values)
			a := tc.Arrange(g)
			ds := g.Reap(t)
			if got := ds.Label(a); got != tc.Want {
				t.Fatalf("decisions %q, want %q (all: %+v)", got, tc.Want, ds)
			}
			if tc.WantRun != "" {
				if r, _ := g.H.Board.Run(a.RunID); r.State != tc.WantRun {
					t.Fatalf("run state %q, want %q", r.State, tc.WantRun)
				}
			} else if got := g.H.Board.Row(a).State; got != tc.WantState {
				t.Fatalf("row state %q, want %q", got, tc.WantState)
			}
			if tc.Check != nil {
				tc.Check(t, g, a, ds)
			}
		})
	}
}

// ExpectPassesStartAt runs one pass per attempt of starts and fails the
// test unless each pass's first decision is about that attempt: what a
// drain whose cursor is carried from pass to pass shows.
func (g *Rig[R]) ExpectPassesStartAt(t testing.TB, starts ...sdk.Attempt) {
	t.Helper()
	for pass, first := range starts {
		if ds := g.Reap(t); ds[0].Attempt != first {
			t.Fatalf("pass %d starts at %v, want %v", pass, ds[0].Attempt, first)
		}
	}
}

// ExpectPinnedToPodUID fails the test unless the substrate was read, every
// liveness read named uid as a's pod UID, and the one teardown was pinned
// to uid: the pod the runner recorded on the attempt, never another pod
// that carries its labels.
func (h *Harness) ExpectPinnedToPodUID(t testing.TB, a sdk.Attempt, uid string) {
	t.Helper()
	calls := h.Exec.LivenessCalls()
	if len(calls) == 0 {
		t.Fatal("no liveness read")
	}
	for _, c := range calls {
		if c.PodUIDs[a] != uid {
			t.Fatalf("liveness request %+v, want the recorded pod UID", c)
		}
	}
	tds := h.Exec.Teardowns()
	if len(tds) != 1 || tds[0].PodUID != uid {
		t.Fatalf("teardowns %+v, want one pinned to the recorded pod UID", tds)
	}
}

// NoActions is a Rule check: the pass stopped and tore down nothing.
func NoActions[R sdk.Reaper](t *testing.T, g *Rig[R], _ sdk.Attempt, _ Decisions) {
	t.Helper()
	if n := g.H.Exec.Actions(); n != 0 {
		t.Fatalf("%d stops or teardowns", n)
	}
}

// NoWrites is a Rule check: the pass wrote nothing to the board.
func NoWrites[R sdk.Reaper](t *testing.T, g *Rig[R], _ sdk.Attempt, _ Decisions) {
	t.Helper()
	if n := g.H.Board.Writes(); n != 0 {
		t.Fatalf("%d writes", n)
	}
}
