package boardtest

import (
	"slices"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

func queuedBefore(threshold time.Time) sdk.CandidateQuery {
	return sdk.CandidateQuery{States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: threshold}
}

func putQueued(f Fixture, runID, taskID string, queuedAt time.Time) {
	f.Put(Row{Attempt: attempt(runID, taskID), State: sdk.StateQueued, QueuedAt: queuedAt})
}

func listingCases() map[string]func(t *testing.T, f Fixture) {
	return map[string]func(t *testing.T, f Fixture){
		"ThresholdAppliedBeforeTheLimit": func(t *testing.T, f Fixture) {
			// Three rows inside the threshold are older by key than none of
			// the old ones: they must never take a slot of the page.
			for i := range 3 {
				putQueued(f, "run", id("new", i), at(-time.Minute))
			}
			putQueued(f, "run", "old0", at(-time.Hour))
			putQueued(f, "run", "old1", at(-2*time.Hour))
			q := queuedBefore(at(-3 * time.Minute))
			q.Limit = 2
			page, err := f.Board().ListCandidates(t.Context(), q)
			if err != nil {
				t.Fatal(err)
			}
			if got := keys(page.Candidates); !slices.Equal(got, []string{"run/old1", "run/old0"}) || page.Next == nil {
				t.Fatalf("page %v next %v, want the two old rows, oldest first, and a cursor", got, page.Next)
			}
		},
		"OldestFirstThenRunThenTaskByKeyset": func(t *testing.T, f Fixture) {
			same := at(-time.Hour)
			putQueued(f, "b", "t1", same)
			putQueued(f, "a", "t2", same)
			putQueued(f, "a", "t1", same)
			putQueued(f, "c", "t0", at(-2*time.Hour))
			putQueued(f, "c", "t9", at(-30*time.Minute))
			q := queuedBefore(at(-time.Minute))
			q.Limit = 2
			var got []string
			for range 10 {
				page, err := f.Board().ListCandidates(t.Context(), q)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, keys(page.Candidates)...)
				if page.Next == nil {
					break
				}
				q.After = page.Next
			}
			if want := []string{"c/t0", "a/t1", "a/t2", "b/t1", "c/t9"}; !slices.Equal(got, want) {
				t.Fatalf("walked %v, want %v", got, want)
			}
		},
		"OnlyNarrowsToTheNamedTaskInstances": func(t *testing.T, f Fixture) {
			putQueued(f, "a", "t1", at(-3*time.Hour))
			putQueued(f, "a", "t2", at(-2*time.Hour))
			putQueued(f, "b", "t1", at(-time.Hour))
			putQueued(f, "b", "fresh", at(-time.Second))
			q := queuedBefore(at(-time.Minute))
			// Named by (run, task) whatever the try and epoch; the threshold
			// and the cursor still apply; a name with no row is no error.
			q.Only = []sdk.Attempt{{RunID: "b", TaskID: "t1", Try: 9, Epoch: 9}, attempt("a", "t1"),
				attempt("b", "fresh"), attempt("nobody", "t")}
			page, err := f.Board().ListCandidates(t.Context(), q)
			if err != nil || !slices.Equal(keys(page.Candidates), []string{"a/t1", "b/t1"}) {
				t.Fatalf("named listing %v err %v, want a/t1 and b/t1", keys(page.Candidates), err)
			}
			q.After = &sdk.Cursor{At: page.Candidates[0].QueuedAt, RunID: "a", TaskID: "t1"}
			page, err = f.Board().ListCandidates(t.Context(), q)
			if err != nil || !slices.Equal(keys(page.Candidates), []string{"b/t1"}) {
				t.Fatalf("named listing after a/t1: %v err %v, want b/t1", keys(page.Candidates), err)
			}
		},
		"ShortPageHasNoCursor": func(t *testing.T, f Fixture) {
			putQueued(f, "run", "t", at(-time.Hour))
			page, err := f.Board().ListCandidates(t.Context(), queuedBefore(at(0)))
			if err != nil || len(page.Candidates) != 1 || page.Next != nil {
				t.Fatalf("page %+v err %v, want one row and no cursor", page, err)
			}
		},
		"PageIsAtMostTheDrainPage": func(t *testing.T, f Fixture) {
			for i := range ladder.DrainPage + 1 {
				putQueued(f, "run", id("t", i), at(-time.Hour-time.Duration(i)*time.Second))
			}
			q := queuedBefore(at(0))
			page, err := f.Board().ListCandidates(t.Context(), q)
			if err != nil || len(page.Candidates) != ladder.PageSize || page.Next == nil {
				t.Fatalf("no limit gave %d rows (err %v), want one page of %d", len(page.Candidates), err, ladder.PageSize)
			}
			q.Limit = 10 * ladder.DrainPage
			page, err = f.Board().ListCandidates(t.Context(), q)
			if err != nil || len(page.Candidates) != ladder.DrainPage || page.Next == nil {
				t.Fatalf("a limit of %d gave %d rows (err %v), want %d and a cursor", q.Limit, len(page.Candidates), err, ladder.DrainPage)
			}
		},
		"NullTimestampIsNeverListed": func(t *testing.T, f Fixture) {
			putQueued(f, "run", "unstamped", time.Time{})
			page, err := f.Board().ListCandidates(t.Context(), queuedBefore(at(0)))
			if err != nil || len(page.Candidates) != 0 {
				t.Fatalf("page %+v err %v, want nothing", page, err)
			}
		},
		"ExecutorAndHeartbeatFilters": func(t *testing.T, f Fixture) {
			running(f, "run", "seen", at(-time.Hour), at(-30*time.Minute))
			running(f, "run", "never", at(-time.Hour), time.Time{})
			f.Put(Row{Attempt: attempt("run", "kube"), State: sdk.StateRunning, Executor: sdk.ExecutorKube,
				RunningAt: at(-time.Hour)})
			for name, tc := range map[string]struct {
				q    sdk.CandidateQuery
				want []string
			}{
				"Lite":  {sdk.CandidateQuery{Executors: []string{sdk.ExecutorLite}}, []string{"run/never", "run/seen"}},
				"Seen":  {sdk.CandidateQuery{Heartbeat: sdk.HeartbeatSeen}, []string{"run/seen"}},
				"Never": {sdk.CandidateQuery{Heartbeat: sdk.HeartbeatNever}, []string{"run/kube", "run/never"}},
			} {
				tc.q.States, tc.q.OrderBy, tc.q.OlderThan = []string{sdk.StateRunning}, sdk.FieldRunningAt, at(0)
				page, err := f.Board().ListCandidates(t.Context(), tc.q)
				if err != nil || !slices.Equal(keys(page.Candidates), tc.want) {
					t.Fatalf("%s: %v err %v, want %v", name, keys(page.Candidates), err, tc.want)
				}
			}
		},
		"ParkedAttemptsByTheTimeTheyParked": func(t *testing.T, f Fixture) {
			f.Put(Row{Attempt: attempt("run", "poke"), State: sdk.StateUpForReschedule, EndedAt: at(-2 * time.Hour)})
			f.Put(Row{Attempt: attempt("run", "deferred"), State: sdk.StateDeferred, EndedAt: at(-3 * time.Hour)})
			f.Put(Row{Attempt: attempt("run", "fresh"), State: sdk.StateUpForReschedule, EndedAt: at(-time.Minute)})
			page, err := f.Board().ListCandidates(t.Context(), sdk.CandidateQuery{
				States:  []string{sdk.StateUpForReschedule, sdk.StateDeferred},
				OrderBy: sdk.FieldEndedAt, OlderThan: at(-time.Hour)})
			if err != nil || !slices.Equal(keys(page.Candidates), []string{"run/deferred", "run/poke"}) {
				t.Fatalf("parked listing %v err %v", keys(page.Candidates), err)
			}
			sameTime(t, "ended_at", page.Candidates[0].EndedAt, at(-3*time.Hour))
		},
		"CandidateCarriesTheFailure": func(t *testing.T, f Fixture) {
			provisional(f, "run", "t", sdk.LabelPodLost, at(-time.Hour))
			page, err := f.Board().ListCandidates(t.Context(), sdk.CandidateQuery{States: []string{sdk.StateFailed},
				OrderBy: sdk.FieldMarkedAt, OlderThan: at(0)})
			if err != nil || len(page.Candidates) != 1 {
				t.Fatalf("page %+v err %v", page, err)
			}
			c := page.Candidates[0]
			if c.LastFailureKind != sdk.FailureInfra || c.FailureReason != sdk.LabelPodLost || c.Executor != sdk.ExecutorKube {
				t.Fatalf("candidate %+v", c)
			}
			sameTime(t, "infra_marked_at", c.InfraMarkedAt, at(-time.Hour))
			sameTime(t, "ended_at", c.EndedAt, at(-time.Hour))
		},
		"MalformedListingIsAnError": func(t *testing.T, f Fixture) {
			for name, q := range map[string]sdk.CandidateQuery{
				"NoStates":      {OrderBy: sdk.FieldQueuedAt, OlderThan: at(0)},
				"UnknownState":  {States: []string{"queued'; --"}, OrderBy: sdk.FieldQueuedAt, OlderThan: at(0)},
				"UnknownColumn": {States: []string{sdk.StateQueued}, OrderBy: "updated_at", OlderThan: at(0)},
				"NoThreshold":   {States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt},
				"UnknownFilter": {States: []string{sdk.StateQueued}, OrderBy: sdk.FieldQueuedAt, OlderThan: at(0), Heartbeat: "maybe"},
			} {
				if _, err := f.Board().ListCandidates(t.Context(), q); err == nil {
					t.Errorf("%s: no error", name)
				}
			}
		},
	}
}
