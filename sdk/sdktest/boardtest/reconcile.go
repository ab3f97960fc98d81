package boardtest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// valve is the infra confirmation valve of the cases: an override must
// come within it of the mark.
const valve = 2 * time.Minute

func confirmOne(t *testing.T, f Fixture, c sdk.Confirm) sdk.MarkResult {
	t.Helper()
	res, err := f.Board().ConfirmInfra(t.Context(), []sdk.Confirm{c})
	return one(t, c.Attempt, res, err)
}

func overrideOne(t *testing.T, f Fixture, o sdk.Override) sdk.MarkResult {
	t.Helper()
	res, err := f.Board().OverrideInfra(t.Context(), []sdk.Override{o})
	return one(t, o.Attempt, res, err)
}

func settleOne(t *testing.T, f Fixture, s sdk.Settlement) sdk.MarkResult {
	t.Helper()
	res, err := f.Board().Settle(t.Context(), []sdk.Settlement{s})
	return one(t, s.Attempt, res, err)
}

// fresh seeds a provisional agent_lost mark made a minute before T0 and
// returns the override a sweep at T0 would make of it.
func fresh(f Fixture) sdk.Override {
	a := provisional(f, "run", "task", sdk.LabelAgentLost, at(-time.Minute))
	return sdk.Override{Attempt: a, MarkedAfter: at(-valve), Term: f.Term(), At: at(0)}
}

func noOverride(t *testing.T, f Fixture, o sdk.Override, reason string) {
	t.Helper()
	before := row(t, f, o.Attempt)
	noop(t, overrideOne(t, f, o), reason)
	unchanged(t, f, o.Attempt, before)
	if lines := f.Log(o.Attempt); len(lines) != 0 {
		t.Fatalf("a refused override logged %v", lines)
	}
}

func settlement(f Fixture, a sdk.Attempt, o sdk.Outcome) sdk.Settlement {
	return sdk.Settlement{Attempt: a, Outcome: o, FromStates: []string{sdk.StateRunning}, Term: f.Term(), At: at(0)}
}

// kubeRunning seeds a kube attempt running since runningAt with its pod
// uid recorded.
func kubeRunning(f Fixture, runID, taskID, uid string, runningAt time.Time) sdk.Attempt {
	a := attempt(runID, taskID)
	f.Put(Row{Attempt: a, State: sdk.StateRunning, Executor: sdk.ExecutorKube, QueuedAt: runningAt.Add(-time.Minute),
		RunningAt: runningAt, PodUID: uid})
	return a
}

func sightOne(t *testing.T, f Fixture, s sdk.PodSighting) sdk.MarkResult {
	t.Helper()
	if s.Term == 0 {
		s.Term = f.Term()
	}
	if s.At.IsZero() {
		s.At = at(0)
	}
	res, err := f.Board().RecordPodSightings(t.Context(), []sdk.PodSighting{s})
	return one(t, s.Attempt, res, err)
}

func sightingCases() map[string]func(t *testing.T, f Fixture) {
	return map[string]func(t *testing.T, f Fixture){
		"RecordPodSightingsKeepsTheLargestEndAndTheOpenWindow": func(t *testing.T, f Fixture) {
			r := at(-10 * time.Minute)
			a := kubeRunning(f, "run", "task", "uid", r)
			for _, step := range []struct {
				seen, missing time.Duration // after running_at; 0: none
				longest       time.Duration
				since         time.Duration // after running_at; -1: none
			}{
				{2 * time.Minute, 0, 2 * time.Minute, -1},
				{time.Minute, 0, 2 * time.Minute, -1},
				{0, 3 * time.Minute, 2 * time.Minute, 3 * time.Minute},
				{0, 4 * time.Minute, 2 * time.Minute, 3 * time.Minute},
				{5 * time.Minute, 6 * time.Minute, 5 * time.Minute, 6 * time.Minute},
				{7 * time.Minute, 0, 7 * time.Minute, -1},
			} {
				s := sdk.PodSighting{Attempt: a, PodUID: "uid"}
				if step.seen > 0 {
					s.SeenAt = r.Add(step.seen)
				}
				if step.missing > 0 {
					s.MissingAt = r.Add(step.missing)
				}
				if res := sightOne(t, f, s); !res.Applied {
					t.Fatalf("%+v: %+v", s, res)
				}
				got := row(t, f, a)
				want := time.Time{}
				if step.since >= 0 {
					want = r.Add(step.since)
				}
				if got.PodMissingMax != step.longest || !got.PodMissingSince.Equal(want) {
					t.Fatalf("after %+v: max %s since %v, want %s %v", s, got.PodMissingMax, got.PodMissingSince, step.longest, want)
				}
			}
		},
		"RecordPodSightingsGuards": func(t *testing.T, f Fixture) {
			r := at(-10 * time.Minute)
			a := kubeRunning(f, "run", "task", "uid", r)
			none := kubeRunning(f, "run", "none", "", r)
			lite := attempt("run", "lite")
			f.Put(Row{Attempt: lite, State: sdk.StateRunning, RunningAt: r, PodUID: "uid-lite"})
			done := attempt("run", "done")
			f.Put(Row{Attempt: done, State: sdk.StateSuccess, Executor: sdk.ExecutorKube, RunningAt: r, EndedAt: at(-time.Minute),
				PodUID: "uid-done"})
			stale := a
			stale.Epoch++
			seen := r.Add(time.Minute)
			for name, c := range map[string]struct {
				s    sdk.PodSighting
				want string
			}{
				"StaleEpoch":     {sdk.PodSighting{Attempt: stale, PodUID: "uid", SeenAt: seen}, sdk.NoopMovedOn},
				"NotRunning":     {sdk.PodSighting{Attempt: done, PodUID: "uid-done", MissingAt: seen}, sdk.NoopMovedOn},
				"Lite":           {sdk.PodSighting{Attempt: lite, PodUID: "uid-lite", SeenAt: seen}, sdk.NoopMovedOn},
				"NoPodRecorded":  {sdk.PodSighting{Attempt: none, PodUID: "uid", SeenAt: seen}, sdk.NoopMovedOn},
				"AnotherPod":     {sdk.PodSighting{Attempt: a, PodUID: "forged", SeenAt: seen, MissingAt: seen}, sdk.NoopPodNotRecorded},
				"BeforeItRan":    {sdk.PodSighting{Attempt: a, PodUID: "uid", SeenAt: r, MissingAt: r}, ""},
				"TermNotCurrent": {sdk.PodSighting{Attempt: a, PodUID: "uid", SeenAt: seen, Term: f.Term() + 1}, sdk.NoopDeposed},
				"NoSuchTask":     {sdk.PodSighting{Attempt: attempt("run", "gone"), PodUID: "uid", SeenAt: seen}, sdk.NoopNotFound},
			} {
				before := row(t, f, a)
				if c.want == "" {
					// A deletion at running_at opens a window (the attempt ran by
					// then); a sighting at running_at ends none.
					if res := sightOne(t, f, c.s); !res.Applied {
						t.Fatalf("%s: %+v", name, res)
					}
					if got := row(t, f, a); got.PodMissingMax != 0 || !got.PodMissingSince.Equal(r) {
						t.Fatalf("%s: max %s since %v", name, got.PodMissingMax, got.PodMissingSince)
					}
					continue
				}
				if res := sightOne(t, f, c.s); res.Applied || res.NoopReason != c.want {
					t.Fatalf("%s: %+v, want %s", name, res, c.want)
				}
				unchanged(t, f, a, before)
			}
			for _, x := range []sdk.Attempt{none, lite, done} {
				if got := row(t, f, x); got.PodMissingMax != 0 || !got.PodMissingSince.IsZero() {
					t.Fatalf("%s changed: %+v", x, got)
				}
			}
		},
		"RecordPodSightingsRefusesAMalformedBatchWhole": func(t *testing.T, f Fixture) {
			a := kubeRunning(f, "run", "task", "uid", at(-time.Hour))
			b := kubeRunning(f, "run", "other", "uid-b", at(-time.Hour))
			for name, ss := range map[string][]sdk.PodSighting{
				"NoPod":             {{Attempt: a, SeenAt: at(-time.Minute)}},
				"NothingSeen":       {{Attempt: a, PodUID: "uid"}},
				"DeletedBeforeSeen": {{Attempt: a, PodUID: "uid", SeenAt: at(-time.Minute), MissingAt: at(-2 * time.Minute)}},
				"TaskTwice": {{Attempt: b, PodUID: "uid-b", SeenAt: at(-time.Minute)},
					{Attempt: b, PodUID: "forged", SeenAt: at(-time.Minute)}},
			} {
				for i := range ss {
					ss[i].Term, ss[i].At = f.Term(), at(0)
				}
				if _, err := f.Board().RecordPodSightings(t.Context(), ss); err == nil {
					t.Fatalf("%s: accepted", name)
				}
				if got := row(t, f, b); got.PodMissingMax != 0 || !got.PodMissingSince.IsZero() {
					t.Fatalf("%s: wrote %+v", name, got)
				}
			}
		},
	}
}

func reconcileCases() map[string]func(t *testing.T, f Fixture) {
	return map[string]func(t *testing.T, f Fixture){
		"ListProvisionalOldestMarkFirstByKeyset": func(t *testing.T, f Fixture) {
			provisional(f, "b", "t", sdk.LabelPodLost, at(-time.Hour))
			provisional(f, "a", "t", sdk.LabelAgentLost, at(-time.Hour))
			provisional(f, "c", "t", sdk.LabelDispatchLost, at(-2*time.Hour))
			confirmed := provisional(f, "d", "t", sdk.LabelPodLost, at(-3*time.Hour))
			r := row(t, f, confirmed)
			r.InfraConfirmedAt = at(-time.Hour)
			f.Put(r)
			f.Put(Row{Attempt: attempt("e", "t"), State: sdk.StateFailed, LastFailureKind: sdk.FailureTask,
				EndedAt: at(-4 * time.Hour)})
			lite := provisional(f, "f", "t", sdk.LabelAgentLost, at(-5*time.Hour))
			r = row(t, f, lite)
			r.Executor = sdk.ExecutorLite
			f.Put(r)

			q := sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorKube}, Limit: 2}
			var got []string
			var reasons []string
			for range 5 {
				page, err := f.Board().ListProvisional(t.Context(), q)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, keys(page.Candidates)...)
				for _, c := range page.Candidates {
					reasons = append(reasons, c.FailureReason)
				}
				if page.Next == nil {
					break
				}
				q.After = page.Next
			}
			if want := []string{"c/t", "a/t", "b/t"}; !slices.Equal(got, want) {
				t.Fatalf("provisional marks %v, want %v", got, want)
			}
			if want := []string{sdk.LabelDispatchLost, sdk.LabelAgentLost, sdk.LabelPodLost}; !slices.Equal(reasons, want) {
				t.Fatalf("reasons %v, want %v", reasons, want)
			}
		},
		// The attempt's duration (reaperctl tune) is measured to its real
		// end, as its record says, not to the sweep that read it.
		"OverrideAndSettleEndAtTheRecordsEnd": func(t *testing.T, f Fixture) {
			o := fresh(f)
			o.EndedAt = at(-90 * time.Second)
			applied(t, overrideOne(t, f, o))
			sameTime(t, "ended_at", row(t, f, o.Attempt).EndedAt, at(-90*time.Second))
			a := attempt("run2", "task")
			f.Put(Row{Attempt: a, State: sdk.StateRunning, RunningAt: at(-time.Hour), LastHeartbeatAt: at(-time.Minute)})
			st := settlement(f, a, sdk.OutcomeSuccess)
			st.EndedAt = at(-30 * time.Second)
			applied(t, settleOne(t, f, st))
			sameTime(t, "ended_at", row(t, f, a).EndedAt, at(-30*time.Second))
		},
		"ConfirmStampsAProvisionalMarkOnce": func(t *testing.T, f Fixture) {
			o := fresh(f)
			c := sdk.Confirm{Attempt: o.Attempt, Term: f.Term(), At: at(0)}
			applied(t, confirmOne(t, f, c))
			sameTime(t, "infra_confirmed_at", row(t, f, o.Attempt).InfraConfirmedAt, at(0))
			c.At = at(time.Second)
			noop(t, confirmOne(t, f, c), sdk.NoopMovedOn)
			sameTime(t, "infra_confirmed_at", row(t, f, o.Attempt).InfraConfirmedAt, at(0))
		},
		"ConfirmOfAnotherEpochIsMovedOn": func(t *testing.T, f Fixture) {
			o := fresh(f)
			before := row(t, f, o.Attempt)
			stale := o.Attempt
			stale.Epoch++
			noop(t, confirmOne(t, f, sdk.Confirm{Attempt: stale, Term: f.Term(), At: at(0)}), sdk.NoopMovedOn)
			unchanged(t, f, o.Attempt, before)
		},
		"ConfirmOfATaskFailureIsMovedOn": func(t *testing.T, f Fixture) {
			a := attempt("run", "task")
			f.Put(Row{Attempt: a, State: sdk.StateFailed, LastFailureKind: sdk.FailureTask, EndedAt: at(-time.Minute)})
			noop(t, confirmOne(t, f, sdk.Confirm{Attempt: a, Term: f.Term(), At: at(0)}), sdk.NoopMovedOn)
		},
		"ConfirmUnderADeposedTermOrExpiredLeaseIsANoop": func(t *testing.T, f Fixture) {
			o := fresh(f)
			before := row(t, f, o.Attempt)
			noop(t, confirmOne(t, f, sdk.Confirm{Attempt: o.Attempt, Term: f.Term() + 1, At: at(0)}), sdk.NoopDeposed)
			f.ExpireLease(at(0))
			noop(t, confirmOne(t, f, sdk.Confirm{Attempt: o.Attempt, Term: f.Term(), At: at(0)}), sdk.NoopDeposed)
			unchanged(t, f, o.Attempt, before)
		},
		"ConfirmOfAMissingRowIsNotFound": func(t *testing.T, f Fixture) {
			fresh(f)
			noop(t, confirmOne(t, f, sdk.Confirm{Attempt: attempt("run", "ghost"), Term: f.Term(), At: at(0)}), sdk.NoopNotFound)
		},
		"DurableSuccessOverridesAProvisionalMark": func(t *testing.T, f Fixture) {
			o := fresh(f)
			applied(t, overrideOne(t, f, o))
			r := row(t, f, o.Attempt)
			if r.State != sdk.StateSuccess || r.LastFailureKind != "" || r.FailureReason != "" || r.ErrorMessage != "" ||
				!r.InfraMarkedAt.IsZero() || !r.InfraConfirmedAt.IsZero() {
				t.Fatalf("row after the override: %+v", r)
			}
			sameTime(t, "ended_at", r.EndedAt, at(0))
			if lines := f.Log(o.Attempt); !slices.Equal(lines, []string{"outcome recovered from the durable record over agent_lost"}) {
				t.Fatalf("log after the override: %q", lines)
			}
		},
		"NoOverrideOnceTheValveOpened": func(t *testing.T, f Fixture) {
			o := fresh(f)
			o.MarkedAfter = at(-time.Minute) // the valve opened at the mark itself
			noOverride(t, f, o, sdk.NoopValveOpen)
		},
		"NoOverrideOnceTheRunFinished": func(t *testing.T, f Fixture) {
			o := fresh(f)
			f.PutRun(RunRow{RunID: "run", State: sdk.RunFailed, StartedAt: at(-24 * time.Hour)})
			noOverride(t, f, o, sdk.NoopRunFinished)
		},
		"NoOverrideOfAConfirmedMark": func(t *testing.T, f Fixture) {
			o := fresh(f)
			applied(t, confirmOne(t, f, sdk.Confirm{Attempt: o.Attempt, Term: f.Term(), At: at(-time.Second)}))
			noOverride(t, f, o, sdk.NoopMovedOn)
		},
		"NoOverrideFromASupersededPod": func(t *testing.T, f Fixture) {
			o := fresh(f)
			o.Epoch++ // the record names another execution of the try
			before := row(t, f, o.Attempt)
			noop(t, overrideOne(t, f, o), sdk.NoopMovedOn)
			o.Epoch--
			unchanged(t, f, o.Attempt, before)
		},
		"NoOverrideUnderADeposedTerm": func(t *testing.T, f Fixture) {
			o := fresh(f)
			f.Depose()
			noOverride(t, f, o, sdk.NoopDeposed)
		},
		"SettleSuccess": func(t *testing.T, f Fixture) {
			a := silent(f)
			applied(t, settleOne(t, f, settlement(f, a, sdk.OutcomeSuccess)))
			r := row(t, f, a)
			if r.State != sdk.StateSuccess || r.LastFailureKind != "" || r.ErrorMessage != "" {
				t.Fatalf("row after a success: %+v", r)
			}
			sameTime(t, "ended_at", r.EndedAt, at(0))
		},
		"SettleFailedIsATaskFailure": func(t *testing.T, f Fixture) {
			a := silent(f)
			s := settlement(f, a, sdk.OutcomeFailed)
			s.Reason, s.Message = "exit_code", "exit_code: 3"
			applied(t, settleOne(t, f, s))
			r := row(t, f, a)
			if r.State != sdk.StateFailed || r.LastFailureKind != sdk.FailureTask || r.FailureReason != "exit_code" ||
				r.ErrorMessage != s.Message || !r.InfraMarkedAt.IsZero() || !r.InfraConfirmedAt.IsZero() {
				t.Fatalf("row after a failure: %+v", r)
			}
			sameTime(t, "ended_at", r.EndedAt, at(0))
		},
		"SettleStoresATenantsTextMadeSafe": func(t *testing.T, f Fixture) {
			// A record's reason and message are the task's words: a NUL,
			// invalid UTF-8 or an overlong text settles, stored as
			// sdk.SafeText makes it, and so does a try log line.
			a := silent(f)
			s := settlement(f, a, sdk.OutcomeFailed)
			s.Reason, s.Message = "exit\x00code", "bad\xffbyte "+strings.Repeat("é", sdk.MaxMessageBytes)
			applied(t, settleOne(t, f, s))
			r := row(t, f, a)
			if r.FailureReason != "exit\uFFFDcode" || r.ErrorMessage != sdk.SafeText(s.Message, sdk.MaxMessageBytes) ||
				len(r.ErrorMessage) > sdk.MaxMessageBytes || !strings.HasSuffix(r.ErrorMessage, sdk.TextCutMarker) {
				t.Fatalf("row after a poisoned failure: reason %q, message of %d bytes", r.FailureReason, len(r.ErrorMessage))
			}
			if err := f.Board().AppendLog(context.Background(), f.Term(), []sdk.LogLine{{Attempt: a, At: at(0), Line: "a\x00b"}}); err != nil {
				t.Fatal(err)
			}
			if log := f.Log(a); len(log) != 1 || log[0] != "a\uFFFDb" {
				t.Fatalf("try log %q", log)
			}
		},
		"ListProvisionalCarriesTheWarmWorkersLastClaim": func(t *testing.T, f Fixture) {
			warm := func(runID, worker string) sdk.Attempt {
				a := provisional(f, runID, "t", sdk.LabelAgentLost, at(-time.Hour))
				r := row(t, f, a)
				r.Executor, r.WarmWorker = sdk.ExecutorWarm, worker
				f.Put(r)
				return a
			}
			held := warm("a-held", "w-1")
			dropped := warm("b-dropped", "w-1")
			unknown := warm("c-unknown", "w-old")
			warm("d-none", "w-never")
			other := held
			other.Epoch++ // the same task's other epoch: not this attempt
			f.RecordWarmClaim("w-1", sdktest.WarmClaim{At: at(-time.Minute), Known: true, Running: []sdk.Attempt{held}})
			f.RecordWarmClaim("w-1", sdktest.WarmClaim{At: at(-2 * time.Minute), Known: true}) // late and older: ignored
			f.RecordWarmClaim("w-old", sdktest.WarmClaim{At: at(-time.Minute)})                // said nothing
			f.RecordWarmClaim("w-other", sdktest.WarmClaim{At: at(-time.Minute), Known: true, Running: []sdk.Attempt{other, dropped}})
			page, err := f.Board().ListProvisional(t.Context(), sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorWarm}})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]sdk.Candidate{}
			for _, c := range page.Candidates {
				got[c.RunID] = c
			}
			if c := got[held.RunID]; !c.WarmClaimHolds || !c.WarmClaimedAt.Equal(at(-time.Minute)) {
				t.Fatalf("a claim that lists the attempt: %+v", c)
			}
			if c := got[dropped.RunID]; c.WarmClaimHolds || !c.WarmClaimedAt.Equal(at(-time.Minute)) {
				t.Fatalf("a claim without the attempt (another worker listing it does not count): %+v", c)
			}
			if c := got[unknown.RunID]; c.WarmClaimHolds || !c.WarmClaimedAt.IsZero() {
				t.Fatalf("a claim that said nothing is unknown: %+v", c)
			}
			if c := got["d-none"]; c.WarmClaimHolds || !c.WarmClaimedAt.IsZero() || c.WarmWorker != "w-never" {
				t.Fatalf("no claim record: %+v", c)
			}
			// The same claim listing the task's other epoch does not hold this one.
			f.RecordWarmClaim("w-1", sdktest.WarmClaim{At: at(0), Known: true, Running: []sdk.Attempt{other}})
			page, err = f.Board().ListProvisional(t.Context(), sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorWarm}, Limit: 1})
			if err != nil || len(page.Candidates) != 1 {
				t.Fatalf("page %+v, %v", page, err)
			}
			if c := page.Candidates[0]; c.RunID != held.RunID || c.WarmClaimHolds || !c.WarmClaimedAt.Equal(at(0)) {
				t.Fatalf("a claim of another epoch holds the attempt: %+v", c)
			}
		},
		"SettleRescheduleOfASensorParksTheAttempt": func(t *testing.T, f Fixture) {
			a := sensorPoke(f, sdk.Sensor{Declared: true, Timeout: time.Hour, FirstPokeAt: at(-20 * time.Minute),
				TryDispatchedAt: at(-21 * time.Minute)})
			res := settleOne(t, f, settlement(f, a, sdk.OutcomeReschedule))
			applied(t, res)
			if res.RescheduleRefused != "" {
				t.Fatalf("a sensor's reschedule inside its bounds was refused: %+v", res)
			}
			r := row(t, f, a)
			if r.State != sdk.StateUpForReschedule || r.LastFailureKind != "" || r.ErrorMessage != "" {
				t.Fatalf("row after a reschedule: %+v", r)
			}
			sameTime(t, "ended_at", r.EndedAt, at(0))
		},
		"SettleInfraIsConfirmedAtOnce": func(t *testing.T, f Fixture) {
			a := silent(f)
			s := settlement(f, a, sdk.OutcomeInfra)
			s.Reason, s.Message = sdk.ReasonPodDisrupted, "pod_disrupted: node shutdown"
			applied(t, settleOne(t, f, s))
			r := row(t, f, a)
			if r.State != sdk.StateFailed || r.LastFailureKind != sdk.FailureInfra || r.FailureReason != sdk.ReasonPodDisrupted ||
				r.ErrorMessage != s.Message {
				t.Fatalf("row after an infra settle: %+v", r)
			}
			sameTime(t, "infra_marked_at", r.InfraMarkedAt, at(0))
			sameTime(t, "infra_confirmed_at", r.InfraConfirmedAt, at(0))
			page, err := f.Board().ListProvisional(t.Context(), sdk.ProvisionalQuery{})
			if err != nil || len(page.Candidates) != 0 {
				t.Fatalf("a confirmed infra settle is listed as provisional: %+v %v", page, err)
			}
		},
		"SettleGuardsTheAttemptAndItsState": func(t *testing.T, f Fixture) {
			a := silent(f)
			before := row(t, f, a)
			s := settlement(f, a, sdk.OutcomeSuccess)
			s.FromStates = []string{sdk.StateQueued}
			noop(t, settleOne(t, f, s), sdk.NoopMovedOn)
			s = settlement(f, a, sdk.OutcomeSuccess)
			s.Try++
			noop(t, settleOne(t, f, s), sdk.NoopMovedOn)
			unchanged(t, f, a, before)
		},
		// A settlement names the states it moves an attempt from, but the
		// board decides which it may: never a terminal one, so a substrate
		// cannot turn a success into a confirmed infra failure.
		"SettleFromATerminalStateIsRefused": func(t *testing.T, f Fixture) {
			a := attempt("run", "done")
			f.Put(Row{Attempt: a, State: sdk.StateSuccess, RunningAt: at(-20 * time.Minute), EndedAt: at(-time.Minute)})
			before := row(t, f, a)
			s := settlement(f, a, sdk.OutcomeInfra)
			s.FromStates, s.Reason, s.Message = []string{sdk.StateRunning, sdk.StateSuccess}, sdk.ReasonPodDisrupted, "pod_disrupted: forged"
			noop(t, settleOne(t, f, s), sdk.NoopSourceRefused)
			unchanged(t, f, a, before)
		},
		"SettleOnAFinishedRunIsANoop": func(t *testing.T, f Fixture) {
			a := silent(f)
			f.PutRun(RunRow{RunID: "run", State: sdk.RunFailed, StartedAt: at(-24 * time.Hour)})
			before := row(t, f, a)
			noop(t, settleOne(t, f, settlement(f, a, sdk.OutcomeSuccess)), sdk.NoopRunFinished)
			unchanged(t, f, a, before)
		},
		"SettleUnderAnExpiredLeaseIsANoop": func(t *testing.T, f Fixture) {
			a := silent(f)
			f.ExpireLease(at(-time.Second))
			noop(t, settleOne(t, f, settlement(f, a, sdk.OutcomeSuccess)), sdk.NoopDeposed)
		},
		// A pod without the exact task id names its task only by the lossy
		// label (Load_A and load-a share load-a): its outcome settles the
		// task instance that records the pod's UID, and no other.
		"SettleFromALossyPodSettlesTheTaskThatRecordsItsUID": func(t *testing.T, f Fixture) {
			own := running(f, "run", "Load_A", at(-20*time.Minute), at(-10*time.Minute))
			r := row(t, f, own)
			r.PodUID = "uid-load-a-upper"
			f.Put(r)
			sibling := running(f, "run", "load-a", at(-20*time.Minute), at(-10*time.Minute))
			r = row(t, f, sibling)
			r.PodUID = "uid-load-a-lower"
			f.Put(r)
			siblingBefore := row(t, f, sibling)
			s := settlement(f, attempt("run", "load-a"), sdk.OutcomeSuccess)
			s.PodUID, s.LossyPod = "uid-load-a-upper", true
			res, err := f.Board().Settle(t.Context(), []sdk.Settlement{s})
			got := one(t, own, res, err)
			applied(t, got)
			if r := row(t, f, own); r.State != sdk.StateSuccess {
				t.Fatalf("Load_A after its own record: %+v", r)
			}
			unchanged(t, f, sibling, siblingBefore)
		},
		"SettleFromALossyPodWhoseUIDNoTaskRecordsSettlesNothing": func(t *testing.T, f Fixture) {
			own := running(f, "run", "Load_A", at(-20*time.Minute), at(-10*time.Minute))
			sibling := running(f, "run", "load-a", at(-20*time.Minute), at(-10*time.Minute))
			r := row(t, f, sibling)
			r.PodUID = "uid-load-a-lower"
			f.Put(r)
			ownBefore, siblingBefore := row(t, f, own), row(t, f, sibling)
			// The label names load-a, and load-a's row holds exactly that
			// attempt: still nothing, for load-a records another pod.
			s := settlement(f, attempt("run", "load-a"), sdk.OutcomeSuccess)
			s.PodUID, s.LossyPod = "uid-nobody", true
			noop(t, settleOne(t, f, s), sdk.NoopNotFound)
			unchanged(t, f, own, ownBefore)
			unchanged(t, f, sibling, siblingBefore)
		},
		"SettleFromALossyPodKeepsItsGuards": func(t *testing.T, f Fixture) {
			own := running(f, "run", "Load_A", at(-20*time.Minute), at(-10*time.Minute))
			r := row(t, f, own)
			r.PodUID = "uid-1"
			f.Put(r)
			before := row(t, f, own)
			s := settlement(f, attempt("run", "load-a"), sdk.OutcomeSuccess)
			s.PodUID, s.LossyPod = "uid-1", true
			s.Try++
			res, err := f.Board().Settle(t.Context(), []sdk.Settlement{s})
			noop(t, one(t, sdk.Attempt{RunID: "run", TaskID: "Load_A", Try: s.Try}, res, err), sdk.NoopMovedOn)
			s.Try--
			s.Term++
			res, err = f.Board().Settle(t.Context(), []sdk.Settlement{s})
			noop(t, one(t, own, res, err), sdk.NoopDeposed)
			unchanged(t, f, own, before)
			s.Term, s.PodUID = f.Term(), ""
			if _, err := f.Board().Settle(t.Context(), []sdk.Settlement{s}); err == nil {
				t.Fatal("a lossy settlement without a pod UID was accepted")
			}
		},
		// A pod is the attempt's only when its UID is the one the attempt
		// records: a pod someone else made with the attempt's labels (and
		// the exact task id) settles nothing.
		"SettleFromAPodOfAnotherUIDThanTheRecordedSettlesNothing": func(t *testing.T, f Fixture) {
			a := silent(f)
			r := row(t, f, a)
			r.PodUID = "uid-recorded"
			f.Put(r)
			before := row(t, f, a)
			s := settlement(f, a, sdk.OutcomeSuccess)
			s.PodUID = "uid-forged"
			noop(t, settleOne(t, f, s), sdk.NoopPodNotRecorded)
			unchanged(t, f, a, before)
			s.PodUID = "uid-recorded"
			applied(t, settleOne(t, f, s))
		},
		// An attempt that records no pod UID (its pod is from before UIDs
		// were recorded, or not recorded yet) keeps the label rule.
		"SettleFromAPodOfAnAttemptThatRecordsNoUIDKeepsTheLabelRule": func(t *testing.T, f Fixture) {
			a := silent(f)
			s := settlement(f, a, sdk.OutcomeSuccess)
			s.PodUID = "uid-any"
			applied(t, settleOne(t, f, s))
		},
		"OverrideFromAPodOfAnotherUIDThanTheRecordedIsRefused": func(t *testing.T, f Fixture) {
			o := fresh(f)
			r := row(t, f, o.Attempt)
			r.PodUID = "uid-own"
			f.Put(r)
			o.PodUID = "uid-forged"
			noOverride(t, f, o, sdk.NoopPodNotRecorded)
			o.PodUID = "uid-own"
			applied(t, overrideOne(t, f, o))
		},
		// A SUCCESS record on a pod that only its lossy labels tie to the
		// marked task overrides the mark only when the attempt records
		// that pod as its own.
		"OverrideFromALossyPodNeedsTheRecordedUID": func(t *testing.T, f Fixture) {
			o := fresh(f)
			r := row(t, f, o.Attempt)
			r.PodUID = "uid-own"
			f.Put(r)
			o.PodUID, o.LossyPod = "uid-sibling", true
			noOverride(t, f, o, sdk.NoopPodNotRecorded)
			o.PodUID = "uid-own"
			applied(t, overrideOne(t, f, o))
			if r := row(t, f, o.Attempt); r.State != sdk.StateSuccess {
				t.Fatalf("row after the override: %+v", r)
			}
		},
		"MalformedReconcilerWritesAreErrors": func(t *testing.T, f Fixture) {
			a := silent(f)
			b := f.Board()
			noReason := settlement(f, a, sdk.OutcomeInfra)
			unknown := settlement(f, a, "exploded")
			noStates := settlement(f, a, sdk.OutcomeSuccess)
			noStates.FromStates = nil
			for name, s := range map[string]sdk.Settlement{"InfraWithoutReason": noReason, "UnknownOutcome": unknown,
				"NoStates": noStates} {
				if _, err := b.Settle(t.Context(), []sdk.Settlement{s}); err == nil {
					t.Errorf("settle %s: accepted", name)
				}
			}
			if _, err := b.ConfirmInfra(t.Context(), []sdk.Confirm{{Attempt: a, At: at(0)}}); err == nil {
				t.Error("a confirmation without a term was accepted")
			}
			if _, err := b.OverrideInfra(t.Context(), []sdk.Override{{Attempt: a, Term: f.Term()}}); err == nil {
				t.Error("an override without a time was accepted")
			}
			if r := row(t, f, a); r.State != sdk.StateRunning {
				t.Fatalf("a refused batch wrote: %+v", r)
			}
		},
	}
}
