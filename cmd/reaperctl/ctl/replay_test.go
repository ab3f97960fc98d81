package ctl

import (
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// histRun is one run of a seeded history, its times before base (0: NULL).
type histRun struct {
	id, state, errMsg string
	started, ended    time.Duration
}

// histAttempt is one attempt of a seeded history: the current one of its
// task (task_instances) or a released one (attempt_history). Its times are
// before base (0: NULL); gap is max_heartbeat_gap (0: NULL). A kube
// attempt carries its pod cache history: podMax is pod_missing_max (0:
// NULL), podSince pod_missing_since, before base (0: NULL).
type histAttempt struct {
	run, task                                  string
	try, epoch                                 int32
	released                                   bool
	state, kind, reason                        string
	queued, running, beat, ended, marked, mint time.Duration
	gap                                        time.Duration
	at                                         time.Duration // updated_at, or released_at when released
	kube                                       bool
	podMax, podSince                           time.Duration
}

// interval is d as an interval's text (nil: NULL for 0).
func interval(d time.Duration) *string {
	if d <= 0 {
		return nil
	}
	s := d.String()
	return &s
}

func ago(d time.Duration) *time.Time {
	if d == 0 {
		return nil
	}
	t := base.Add(-d)
	return &t
}

func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// seedHistory writes the runs and attempts straight into the board: the
// history a fleet leaves, with exact gaps, waits and quiet periods.
func (b *bundle) seedHistory(t *testing.T, runs []histRun, attempts []histAttempt) {
	t.Helper()
	ctx := context.Background()
	for _, r := range runs {
		if _, err := b.pool.Exec(ctx, `INSERT INTO runs (run_id, dag_id, state, started_at, ended_at, error_message, updated_at)
            VALUES ($1, 'dag', $2, $3, $4, $5, $6)`, r.id, r.state, ago(r.started), ago(r.ended), orNull(r.errMsg),
			base.Add(-min(r.ended, r.started))); err != nil {
			t.Fatal(err)
		}
	}
	for _, current := range []bool{true, false} {
		for _, a := range attempts {
			if a.released == current {
				continue
			}
			table, atCol := "task_instances", "updated_at"
			if a.released {
				table, atCol = "attempt_history", "released_at"
			}
			executor := sdk.ExecutorLite
			if a.kube {
				executor = sdk.ExecutorKube
			}
			confirmed := ago(a.marked)
			if _, err := b.pool.Exec(ctx, `INSERT INTO `+table+` (run_id, task_id, try_number, attempt_epoch, state,
                executor, queued_at, running_at, last_heartbeat_at, ended_at, last_failure_kind, failure_reason,
                infra_marked_at, infra_confirmed_at, credential_minted_at, max_heartbeat_gap, pod_missing_max,
                pod_missing_since, `+atCol+`)
                VALUES ($1, $2, $3, $4, $5, $17, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::interval, $18::interval, $19, $16)`,
				a.run, a.task, a.try, a.epoch, a.state, ago(a.queued), ago(a.running), ago(a.beat), ago(a.ended),
				orNull(a.kind), orNull(a.reason), ago(a.marked), confirmed, ago(a.mint), interval(a.gap), base.Add(-a.at),
				executor, interval(a.podMax), ago(a.podSince)); err != nil {
				t.Fatalf("seed %s/%s try %d epoch %d: %v", a.run, a.task, a.try, a.epoch, err)
			}
		}
	}
}

const (
	sec  = time.Second
	mins = time.Minute
	hrs  = time.Hour
)

// replayLadder keeps the default ladder but for a settling grace of 8m, so
// that agent_lost candidates up to 6m stay in order.
const replayLadder = "ladder {\n  settling_grace = \"8m\"\n}\n"

// replayBoard seeds a history whose every value is known (the expected
// counts and shifts of the tests below are worked out from it):
//
//	r1 running since 101m ago: a (a 2m gap, running), b (its first try
//	    failed after a 2m silence before its report; its second a 5m gap,
//	    succeeded), c (its first epoch marked agent_lost 5m after its last
//	    heartbeat), d (marked pod_lost, silent 2m), e (its first epoch marked
//	    dispatch_lost after 4m queued; its second waited 7m to start)
//	r2 success: y (its first try failed credential_ceiling after 1h1m on its
//	    credential; its second lived 58m), x (2h20m); quiet 10m between them
//	    and 12m before the run's end
//	r3 failed by the orphan-run reap, 10m quiet after q succeeded
//	r0 ended 8 days ago, with a 40m gap and a 30m one: out of the window
func replayBoard(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, replayLadder)
	b.seedHistory(t, []histRun{
		{id: "r0", state: sdk.RunSuccess, started: 9 * 24 * hrs, ended: 8 * 24 * hrs},
		{id: "r1", state: sdk.RunRunning, started: 101 * mins},
		{id: "r2", state: sdk.RunSuccess, started: 6*hrs + mins, ended: hrs + 18*mins},
		{id: "r3", state: sdk.RunFailed, started: 3 * hrs, ended: 2*hrs + 30*mins, errMsg: "orphan_run: no live task for 10m"},
	}, []histAttempt{
		{run: "r0", task: "o", try: 1, released: true, state: sdk.StateFailed, kind: "task", reason: "exit_code",
			queued: 9 * 24 * hrs, running: 9*24*hrs - mins, beat: 8*24*hrs + hrs, ended: 8*24*hrs + hrs, gap: 40 * mins,
			at: 8*24*hrs + 59*mins},
		{run: "r0", task: "o", try: 2, state: sdk.StateSuccess, queued: 8*24*hrs + 59*mins, running: 8*24*hrs + 58*mins,
			beat: 8*24*hrs + mins, ended: 8 * 24 * hrs, gap: 30 * mins, at: 8 * 24 * hrs},

		{run: "r1", task: "a", try: 1, state: sdk.StateRunning, queued: 64 * mins, running: 60 * mins, beat: 10 * sec,
			gap: 2 * mins, at: 10 * sec},
		{run: "r1", task: "b", try: 1, released: true, state: sdk.StateFailed, kind: "task", reason: "exit_code",
			queued: 50 * mins, running: 49 * mins, beat: 40 * mins, ended: 38 * mins, gap: 45 * sec, at: 37 * mins},
		{run: "r1", task: "b", try: 2, state: sdk.StateSuccess, queued: 37 * mins, running: 36 * mins, beat: 31 * mins,
			ended: 30 * mins, mint: 37 * mins, gap: 5 * mins, at: 30 * mins},
		{run: "r1", task: "c", try: 1, released: true, state: sdk.StateFailed, kind: "infra", reason: sdk.LabelAgentLost,
			queued: 31 * mins, running: 30 * mins, beat: 20 * mins, marked: 15 * mins, ended: 15 * mins, gap: mins,
			at: 14 * mins},
		{run: "r1", task: "c", try: 1, epoch: 1, state: sdk.StateRunning, queued: 14 * mins, running: 13 * mins,
			beat: mins, gap: 30 * sec, at: mins},
		{run: "r1", task: "d", try: 1, state: sdk.StateFailed, kind: "infra", reason: sdk.LabelPodLost,
			queued: 19*mins + 30*sec, running: 19 * mins, beat: 18 * mins, marked: 16 * mins, ended: 16 * mins, gap: mins,
			at: 16 * mins},
		{run: "r1", task: "e", try: 1, released: true, state: sdk.StateFailed, kind: "infra", reason: sdk.LabelDispatchLost,
			queued: 100 * mins, marked: 96 * mins, ended: 96 * mins, at: 95 * mins},
		{run: "r1", task: "e", try: 1, epoch: 1, state: sdk.StateRunning, queued: 95 * mins, running: 88 * mins,
			beat: 5 * sec, gap: 20 * sec, at: 5 * sec},

		{run: "r2", task: "y", try: 1, released: true, state: sdk.StateFailed, kind: "task", reason: sdk.LabelCredentialCeiling,
			queued: 6 * hrs, mint: 6 * hrs, running: 5*hrs + 59*mins, ended: 4*hrs + 59*mins, at: 4*hrs + 58*mins},
		{run: "r2", task: "y", try: 2, state: sdk.StateSuccess, queued: 4*hrs + 58*mins, mint: 4*hrs + 58*mins,
			running: 4*hrs + 57*mins, beat: 4*hrs + 10*sec, ended: 4 * hrs, gap: 40 * sec, at: 4 * hrs},
		{run: "r2", task: "x", try: 1, state: sdk.StateSuccess, queued: 3*hrs + 50*mins, mint: 3*hrs + 50*mins,
			running: 3*hrs + 49*mins, beat: hrs + 30*mins + 5*sec, ended: hrs + 30*mins, gap: 50 * sec, at: hrs + 30*mins},

		{run: "r3", task: "q", try: 1, state: sdk.StateSuccess, queued: 3 * hrs, running: 2*hrs + 59*mins,
			beat: 2*hrs + 40*mins, ended: 2*hrs + 40*mins, gap: 30 * sec, at: 2*hrs + 40*mins},
	})
	return b
}

// want is one candidate's expected replay.
type want struct {
	value              time.Duration
	falseReaps         int
	recovered          int
	medianShift, maxSh time.Duration
}

func findRung(t *testing.T, doc replayJSON, name string) rungJSON {
	t.Helper()
	for _, r := range doc.Rungs {
		if r.Rung == name {
			return r
		}
	}
	t.Fatalf("no rung %s in %+v", name, doc.Rungs)
	return rungJSON{}
}

func checkCandidates(t *testing.T, r rungJSON, wants []want) {
	t.Helper()
	if len(r.Candidates) != len(wants) {
		var got []float64
		for _, c := range r.Candidates {
			got = append(got, c.Seconds)
		}
		t.Fatalf("%s: candidates %v, want %d", r.Rung, got, len(wants))
	}
	for i, w := range wants {
		c := r.Candidates[i]
		if c.Seconds != w.value.Seconds() || c.FalseReaps != w.falseReaps || c.LostRecovered != w.recovered {
			t.Errorf("%s %s: %vs, %d false reaps, %d recovered; want %d false reaps, %d recovered", r.Rung, w.value,
				c.Seconds, c.FalseReaps, c.LostRecovered, w.falseReaps, w.recovered)
			continue
		}
		if len(c.FalseReapAttempts) != w.falseReaps {
			t.Errorf("%s %s: %d false reaps listed, want %d", r.Rung, w.value, len(c.FalseReapAttempts), w.falseReaps)
		}
		if w.recovered == 0 {
			if c.MedianShiftSeconds != nil || c.MaxShiftSeconds != nil {
				t.Errorf("%s %s: a shift with nothing recovered", r.Rung, w.value)
			}
			continue
		}
		if *c.MedianShiftSeconds != w.medianShift.Seconds() || *c.MaxShiftSeconds != w.maxSh.Seconds() {
			t.Errorf("%s %s: shifts median %vs max %vs, want %s %s", r.Rung, w.value, *c.MedianShiftSeconds,
				*c.MaxShiftSeconds, w.medianShift, w.maxSh)
		}
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("ExactFalseReapsAndShiftsForEveryCandidate", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		var doc replayJSON
		b.ctl(t, "replay", "-o", "json").ok(t).decode(t, &doc)
		if doc.WindowSeconds != ReplayWindowDefault.Seconds() || doc.Since == nil || !doc.Since.Equal(base.Add(-ReplayWindowDefault)) {
			t.Fatalf("window %v since %v", doc.WindowSeconds, doc.Since)
		}
		if len(doc.Rungs) != 5 {
			t.Fatalf("%d rungs", len(doc.Rungs))
		}

		agent := findRung(t, doc, rungAgentLost)
		if *agent.Observed != 10 || *agent.LostCount != 2 {
			t.Fatalf("agent_lost: %d observed, %d lost", *agent.Observed, *agent.LostCount)
		}
		// Silences 5m, 2m, 2m, 1m, 1m, 50s, 40s, 30s, 30s, 20s; lost: c
		// silent 5m (agent_lost), d silent 2m (pod_lost: recovered by
		// agent_lost only under 2m).
		checkCandidates(t, agent, []want{
			{23 * sec, 9, 2, -(4*mins + 37*sec), -(mins + 37*sec)},
			{45 * sec, 6, 2, -(4*mins + 15*sec), -(mins + 15*sec)},
			{70 * sec, 3, 2, -(3*mins + 50*sec), -50 * sec},
			{90 * sec, 3, 2, -(3*mins + 30*sec), -30 * sec},
			{140 * sec, 1, 1, -(2*mins + 40*sec), -(2*mins + 40*sec)},
			{3 * mins, 1, 1, -2 * mins, -2 * mins},
			{270 * sec, 1, 1, -30 * sec, -30 * sec},
			{5 * mins, 0, 1, 0, 0},
			{6 * mins, 0, 1, mins, mins},
		})
		if c := agent.Candidates[3]; !c.Configured || c.Source != sourceConfigured {
			t.Fatalf("the configured candidate %+v", c)
		}
		if c := agent.Candidates[7]; c.Source != sourceTail || c.Configured {
			t.Fatalf("the tail candidate %+v", c)
		}
		top := agent.FalseReaps
		if len(top) != 9 || top[0].RunID != "r1" || top[0].TaskID != "b" || *top[0].Try != 2 || top[0].ValueSeconds != 300 ||
			top[0].Proof != "heartbeat" {
			t.Fatalf("agent_lost false reaps %+v", top)
		}
		// The 2m tie: r1/a (a heartbeat gap) before r1/b's first try (the
		// silence before its failed report).
		if top[1].TaskID != "a" || top[2].TaskID != "b" || *top[2].Try != 1 || top[2].Proof != "report" {
			t.Fatalf("agent_lost ties %+v %+v", top[1], top[2])
		}
		if l := agent.Lost; l[0].TaskID != "c" || l[0].ValueSeconds != 300 || !l[0].Own || l[1].TaskID != "d" || l[1].Own ||
			l[1].Reason != sdk.LabelPodLost {
			t.Fatalf("agent_lost lost %+v", l)
		}
		var dropped []float64
		for _, d := range agent.Dropped {
			dropped = append(dropped, d.Seconds)
			if !strings.Contains(d.Why, "settling_grace (480s) must be greater than agent_lost") {
				t.Fatalf("dropped %+v", d)
			}
		}
		if len(dropped) != 0 {
			t.Fatalf("agent_lost dropped %v", dropped)
		}

		// Waits 7m, 4m, 1m x 8, 30s; lost: e's first epoch after 4m.
		dispatch := findRung(t, doc, rungDispatchLost)
		if *dispatch.Observed != 11 || *dispatch.LostCount != 1 {
			t.Fatalf("dispatch_lost: %d observed, %d lost", *dispatch.Observed, *dispatch.LostCount)
		}
		checkCandidates(t, dispatch, []want{
			{45 * sec, 10, 1, -(3*mins + 15*sec), -(3*mins + 15*sec)},
			{90 * sec, 2, 1, -(2*mins + 30*sec), -(2*mins + 30*sec)},
			{140 * sec, 2, 1, -100 * sec, -100 * sec},
			{3 * mins, 2, 1, -mins, -mins},
			{270 * sec, 1, 1, 30 * sec, 30 * sec},
			{6 * mins, 1, 1, 2 * mins, 2 * mins},
			{7 * mins, 0, 1, 3 * mins, 3 * mins},
			{9 * mins, 0, 1, 5 * mins, 5 * mins},
			{12 * mins, 0, 1, 8 * mins, 8 * mins},
		})
		if f := dispatch.FalseReaps[0]; f.TaskID != "e" || *f.Epoch != 1 || f.Proof != "started" || f.ValueSeconds != 420 {
			t.Fatalf("dispatch_lost largest %+v", f)
		}

		// Quiet: r2 12m before its success, r1 1m before e's first queue;
		// lost: r3, 10m quiet when reaped.
		orphan := findRung(t, doc, rungOrphanRun)
		if *orphan.Observed != 2 || *orphan.LostCount != 1 {
			t.Fatalf("orphan_run: %d observed, %d lost", *orphan.Observed, *orphan.LostCount)
		}
		checkCandidates(t, orphan, []want{
			{80 * sec, 1, 1, -(8*mins + 40*sec), -(8*mins + 40*sec)},
			{150 * sec, 1, 1, -(7*mins + 30*sec), -(7*mins + 30*sec)},
			{230 * sec, 1, 1, -(6*mins + 10*sec), -(6*mins + 10*sec)},
			{5 * mins, 1, 1, -5 * mins, -5 * mins},
			{450 * sec, 1, 1, -150 * sec, -150 * sec},
			{10 * mins, 1, 1, 0, 0},
			{12 * mins, 0, 1, 2 * mins, 2 * mins},
			{15 * mins, 0, 1, 5 * mins, 5 * mins},
			{20 * mins, 0, 1, 10 * mins, 10 * mins},
		})
		if f := orphan.FalseReaps; len(f) != 1 || f[0].RunID != "r2" || f[0].TaskID != "" || f[0].Proof != "run_success" ||
			!f[0].From.Equal(base.Add(-hrs-30*mins)) || !f[0].To.Equal(base.Add(-hrs-18*mins)) {
			t.Fatalf("orphan_run false reaps %+v", f)
		}
		if l := orphan.Lost; l[0].RunID != "r3" || l[0].ValueSeconds != 600 || l[0].Reason != sdk.LabelOrphanRun {
			t.Fatalf("orphan_run lost %+v", l)
		}

		// Credential lives 2h20m, 58m, 20m (r3/q: from its queueing, no
		// mint recorded), 7m; lost: y's first try after 1h1m.
		ceiling := findRung(t, doc, rungCeiling)
		if *ceiling.Observed != 4 || *ceiling.LostCount != 1 {
			t.Fatalf("credential_ceiling: %d observed, %d lost", *ceiling.Observed, *ceiling.LostCount)
		}
		checkCandidates(t, ceiling, []want{
			{15 * mins, 3, 1, -46 * mins, -46 * mins},
			{30 * mins, 2, 1, -31 * mins, -31 * mins},
			{45 * mins, 2, 1, -16 * mins, -16 * mins},
			{hrs, 1, 1, -mins, -mins},
			{90 * mins, 1, 1, 29 * mins, 29 * mins},
			{2 * hrs, 1, 1, 59 * mins, 59 * mins},
			{140 * mins, 0, 1, 79 * mins, 79 * mins},
			{3 * hrs, 0, 1, 119 * mins, 119 * mins},
			{4 * hrs, 0, 1, 179 * mins, 179 * mins},
		})

		// No pod cache misses in this history; lost: d, marked pod_lost
		// after running 3m.
		pod := findRung(t, doc, rungPodLostFloor)
		if pod.Status != statusReplayed || *pod.Observed != 0 || *pod.LostCount != 1 || *pod.ConfiguredSeconds != 60 ||
			pod.Lost[0].TaskID != "d" || pod.Lost[0].ValueSeconds != 180 || !pod.Lost[0].Own {
			t.Fatalf("pod_lost_floor %+v", pod)
		}
		checkCandidates(t, pod, []want{
			{15 * sec, 0, 1, -(2*mins + 45*sec), -(2*mins + 45*sec)},
			{30 * sec, 0, 1, -(2*mins + 30*sec), -(2*mins + 30*sec)},
			{45 * sec, 0, 1, -(2*mins + 15*sec), -(2*mins + 15*sec)},
			{mins, 0, 1, -2 * mins, -2 * mins},
			{90 * sec, 0, 1, -90 * sec, -90 * sec},
			{2 * mins, 0, 1, -mins, -mins},
			{3 * mins, 0, 1, 0, 0},
			{4 * mins, 0, 1, mins, mins},
		})
	})

	// Kube attempts' pod cache misses: a closed window (the pod came back)
	// counts at its end, an open one at the attempt's last heartbeat or own
	// outcome after it, one with neither not at all; a pod_lost mark is the
	// lost one the shifts are measured from.
	t.Run("PodLostFloorExactFalseReapsAndShiftsFromTheWindows", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.seedHistory(t, []histRun{{id: "k", state: sdk.RunRunning, started: hrs}}, []histAttempt{
			{run: "k", task: "a", try: 1, kube: true, state: sdk.StateRunning, queued: 11 * mins, running: 10 * mins,
				beat: 10 * sec, podMax: 3 * mins, at: 10 * sec},
			{run: "k", task: "b", try: 1, kube: true, state: sdk.StateRunning, queued: 11 * mins, running: 10 * mins,
				beat: 8 * mins, podSince: 9 * mins, at: 8 * mins},
			{run: "k", task: "c", try: 1, kube: true, state: sdk.StateSuccess, queued: 21 * mins, running: 20 * mins,
				beat: 19*mins + 50*sec, ended: 19 * mins, podSince: 19*mins + 30*sec, at: 19 * mins},
			{run: "k", task: "d", try: 1, kube: true, state: sdk.StateRunning, queued: 11 * mins, running: 10 * mins,
				beat: 6 * mins, podSince: 5 * mins, at: 5 * mins},
			{run: "k", task: "e", try: 1, released: true, kube: true, state: sdk.StateSuccess, queued: 41 * mins,
				running: 40 * mins, ended: 35 * mins, podMax: 40 * sec, at: 34 * mins},
			{run: "k", task: "e", try: 2, kube: true, state: sdk.StateRunning, queued: 34 * mins, running: 33 * mins,
				beat: 10 * sec, at: 10 * sec},
			{run: "k", task: "f", try: 1, kube: true, state: sdk.StateFailed, kind: "infra", reason: sdk.LabelPodLost,
				queued: 16 * mins, running: 15 * mins, beat: 14 * mins, marked: 13 * mins, ended: 13 * mins, at: 13 * mins},
		})
		var doc replayJSON
		b.ctl(t, "replay", "-o", "json", "-rung", "pod_lost_floor").ok(t).decode(t, &doc)
		r := doc.Rungs[0]
		// Misses 3m (a, its pod came back), 2m (b, a heartbeat after its pod
		// was deleted), 1m (c, its success after), 40s (e's first try); d
		// proved nothing after its deletion. Lost: f after running 2m.
		if *r.Observed != 4 || *r.LostCount != 1 {
			t.Fatalf("pod_lost_floor: %d observed, %d lost", *r.Observed, *r.LostCount)
		}
		checkCandidates(t, r, []want{
			{15 * sec, 4, 1, -(mins + 45*sec), -(mins + 45*sec)},
			{30 * sec, 4, 1, -90 * sec, -90 * sec},
			{45 * sec, 3, 1, -(mins + 15*sec), -(mins + 15*sec)},
			{mins, 2, 1, -mins, -mins},
			{90 * sec, 2, 1, -30 * sec, -30 * sec},
			{2 * mins, 1, 1, 0, 0},
			{3 * mins, 0, 1, mins, mins},
			{4 * mins, 0, 1, 2 * mins, 2 * mins},
		})
		f := r.FalseReaps
		if len(f) != 4 || f[0].TaskID != "a" || f[0].Proof != "pod_seen" || f[1].TaskID != "b" || f[1].Proof != "heartbeat" ||
			f[2].TaskID != "c" || f[2].Proof != "success" || f[3].TaskID != "e" || *f[3].Try != 1 || f[3].ValueSeconds != 40 {
			t.Fatalf("false reaps %+v", f)
		}
		if !f[1].From.Equal(base.Add(-10*mins)) || !f[1].To.Equal(base.Add(-8*mins)) {
			t.Fatalf("b measured from %v to %v, want running_at to its heartbeat", f[1].From, f[1].To)
		}
		if l := r.Lost; l[0].TaskID != "f" || l[0].ValueSeconds != 120 || l[0].Reason != sdk.LabelPodLost || !l[0].Own {
			t.Fatalf("lost %+v", l)
		}
		out := b.ctl(t, "replay", "-rung", "pod_lost_floor").ok(t).stdout
		for _, want := range []string{
			"pod cache misses that later proved alive: 4; the largest 3m: k/a try 1 epoch 0 (pod_seen)",
			"k/f try 1 epoch 0  running 2m when settled pod_lost at",
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("table lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("GivenCandidatesForOneRung", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		var doc replayJSON
		b.ctl(t, "replay", "-json", "-rung", "dispatch_lost", "-candidates", "30s,1m,5m").ok(t).decode(t, &doc)
		if len(doc.Rungs) != 1 {
			t.Fatalf("rungs %+v", doc.Rungs)
		}
		r := doc.Rungs[0]
		// No range, no tail: the given ones only, none of them configured.
		checkCandidates(t, r, []want{
			{30 * sec, 10, 1, -(3*mins + 30*sec), -(3*mins + 30*sec)},
			{mins, 2, 1, -3 * mins, -3 * mins},
			{5 * mins, 1, 1, mins, mins},
		})
		for _, c := range r.Candidates {
			if c.Source != sourceGiven || c.Configured {
				t.Fatalf("candidate %+v", c)
			}
		}
	})

	t.Run("ACandidateOutOfLadderOrderIsRefusedNamingTheRung", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		b.ctl(t, "replay", "-rung", "agent_lost", "-candidates", "30s,10m").failed(t, exitUsage,
			"agent_lost 10m breaks the timing ladder: settling_grace (480s) must be greater than agent_lost (10m)")
		b.ctl(t, "replay", "-rung", "agent_lost", "-candidates", "15s").failed(t, exitUsage,
			"agent_lost 15s breaks the timing ladder: agent_lost (15s) must be greater than heartbeat (15s)")
		b.ctl(t, "replay", "-rung", keyCredentialCeiling, "-candidates", "5m").failed(t, exitUsage,
			"credential_ceiling 5m breaks the timing ladder: auth.max_attempt_credential_lifetime (300s) must be greater than attempt_token_ttl (10m)")
	})

	t.Run("TheDefaultRangeLeavesOutWhatBreaksTheLadderAndSaysWhy", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "replay", "-rung", "agent_lost").ok(t)
		for _, want := range []string{
			"nothing observed in the window: no attempts to judge a threshold by",
			"left out 3m (range): agent_lost 3m breaks the timing ladder: settling_grace (180s) must be greater than agent_lost (180s)",
			"left out 6m (range): agent_lost 6m breaks the timing ladder:",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Fatalf("output lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("ADisabledCeilingIsReplayedAroundTheDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "auth {\n  max_attempt_credential_lifetime = \"0\"\n}\n")
		var doc replayJSON
		b.ctl(t, "replay", "-json", "-rung", "credential_ceiling").ok(t).decode(t, &doc)
		r := doc.Rungs[0]
		if r.ConfiguredSeconds != nil || len(r.Candidates) != len(rangeFactors) || r.Candidates[3].Seconds != 3600 {
			t.Fatalf("credential_ceiling %+v", r)
		}
		for _, c := range r.Candidates {
			if c.Configured {
				t.Fatalf("a disabled ceiling has a configured candidate: %+v", c)
			}
		}
		if out := b.ctl(t, "replay", "-rung", "credential_ceiling").ok(t).stdout; !strings.Contains(out,
			"credential_ceiling (auth.max_attempt_credential_lifetime, configured disabled)") {
			t.Fatalf("table:\n%s", out)
		}
	})

	t.Run("MalformedCommandLines", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.ctl(t, "replay", "-candidates", "1m").failed(t, exitUsage, "-candidates needs -rung")
		b.ctl(t, "replay", "-rung", "nope").failed(t, exitUsage, `-rung "nope": want one of agent_lost, dispatch_lost`)
		b.ctl(t, "replay", "-rung", "agent_lost", "-candidates", "1m,soon").failed(t, exitUsage, `"soon" is not a duration`)
		b.ctl(t, "replay", "-rung", "agent_lost", "-candidates", "0s").failed(t, exitUsage, "0s is not positive")
		b.ctl(t, "replay", "-o", "yaml").failed(t, exitUsage, `-o "yaml": want table or json`)
		b.ctl(t, "replay", "-window", "-1h").failed(t, exitUsage, "must not be negative")
	})

	t.Run("TheWholeHistoryWithWindowZero", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		var doc replayJSON
		b.ctl(t, "replay", "-json", "-window", "0", "-rung", "agent_lost").ok(t).decode(t, &doc)
		r := doc.Rungs[0]
		// r0, eight days old, joins: its 40m and 30m gaps.
		if doc.Since != nil || *r.Observed != 12 || r.Largest.RunID != "r0" || r.Largest.ValueSeconds != 2400 {
			t.Fatalf("since %v, %d observed, largest %+v", doc.Since, *r.Observed, r.Largest)
		}
	})

	t.Run("HistoryWrittenByTheBoardsOwnWriters", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		b := setup(t, replayLadder)
		b.createRun(t, "w", base.Add(-time.Hour), "t")
		a := first("w", "t")
		t0 := base.Add(-30 * time.Minute)
		beat := func(at time.Time) {
			t.Helper()
			if stop, err := b.w.HeartbeatCredentials(ctx, []lifecycle.HeartbeatCall{{Attempt: a, At: at}}); err != nil || stop[0] {
				t.Fatalf("heartbeat at %s: %v %v", at, stop, err)
			}
		}
		// The first try: silent 3m between two heartbeats, then fails on
		// its own; the retry rail keeps it in attempt_history.
		b.running(t, a, t0.Add(-time.Minute), t0, time.Time{})
		beat(t0.Add(time.Minute))
		beat(t0.Add(4 * time.Minute))
		if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateFailed, Reason: "exit_code"}, t0.Add(5*time.Minute)); err != nil || stop {
			t.Fatalf("report: %v %v", stop, err)
		}
		if rel, err := b.w.Retry(ctx, a, t0.Add(6*time.Minute)); err != nil || !rel.Applied {
			t.Fatalf("retry: %+v %v", rel, err)
		}
		// The second: 30s to its heartbeat, 30s more to its success.
		a.Try = 2
		b.running(t, a, t0.Add(7*time.Minute), t0.Add(8*time.Minute), time.Time{})
		beat(t0.Add(8*time.Minute + 30*time.Second))
		if stop, err := b.w.Report(ctx, a, lifecycle.TerminalReport{State: sdk.StateSuccess}, t0.Add(9*time.Minute)); err != nil || stop {
			t.Fatalf("report: %v %v", stop, err)
		}
		var doc replayJSON
		b.ctl(t, "replay", "-json", "-rung", "agent_lost", "-candidates", "20s,2m,4m").ok(t).decode(t, &doc)
		r := doc.Rungs[0]
		checkCandidates(t, r, []want{{20 * sec, 2, 0, 0, 0}, {2 * mins, 1, 0, 0, 0}, {4 * mins, 0, 0, 0, 0}})
		if f := r.FalseReaps; *f[0].Try != 1 || f[0].ValueSeconds != 180 || f[0].Proof != "heartbeat" ||
			*f[1].Try != 2 || f[1].ValueSeconds != 30 {
			t.Fatalf("false reaps %+v", f)
		}
	})

	t.Run("TableNamesTheAttemptsBehindEveryNumber", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		r := b.ctl(t, "replay", "-rung", "orphan_run").ok(t)
		golden(t, r.stdout, `
replay of the last 7d (attempts released or last written since 2029-12-26T12:00:00Z; runs ended since, or not ended)

orphan_run (configured 5m)
  measures run quiet: a run's longest stretch with no attempt live and no activity
  quiet periods that later proved alive: 2; the largest 12m: r2 (run_success)
  runs settled lost: 1
  CANDIDATE  FALSE REAPS  LOST RECOVERED  MEDIAN SHIFT  MAX SHIFT
  1m20s      1            1 of 1          -8m40s        -8m40s
  2m30s      1            1 of 1          -7m30s        -7m30s
  3m50s      1            1 of 1          -6m10s        -6m10s
  5m         1            1 of 1          -5m           -5m        <- configured
  7m30s      1            1 of 1          -2m30s        -2m30s
  10m        1            1 of 1          0s            0s
  12m        0            1 of 1          +2m           +2m        the observed tail, rounded up
  15m        0            1 of 1          +5m           +5m
  20m        0            1 of 1          +10m          +10m
  false reaps, the largest value first (each is one at every candidate under its value):
    r2  12m  run_success (2030-01-02T10:30:00Z to 2030-01-02T10:42:00Z)
  lost, the largest value first (what the shifts are measured from):
    r3  quiet 10m when settled orphan_run at 2030-01-02T09:30:00Z

note: a false reap is a value above the candidate that later proved alive; a reaper judging by the threshold alone would have settled it (its liveness read might still have deferred it)
note: a shift is the candidate minus the value at which a lost one was settled: negative, recovered sooner
note: orphan_run counts from stamps: the time a task waited scheduled is not stamped, so a run's quiet can read longer than it was (more false reaps, never fewer)
note: agent_lost counts an attempt's first silence from its running report; on kube that window is pod_lost's, so there the count can only be higher than agent_lost's own
note: pod_lost_floor counts only the windows the kube substrate's pod cache saw (not its first list after a start, nor a pod the attempt never recorded) and only where the history is recorded (from migration 013 on): a board without it reads as nothing observed
`)
		r = b.ctl(t, "replay", "-rung", "pod_lost_floor").ok(t)
		if !strings.Contains(r.stdout, "pod_lost_floor (configured 1m)\n  measures pod cache miss:") ||
			!strings.Contains(r.stdout, "nothing observed in the window: no attempts to judge a threshold by") {
			t.Fatalf("pod_lost_floor:\n%s", r.stdout)
		}
	})

	t.Run("ThePictureDrawsEachCandidateOnTheTail", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		path := filepath.Join(t.TempDir(), "tail.svg")
		var doc replayJSON
		b.ctl(t, "replay", "-json", "-picture", path).ok(t).decode(t, &doc)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		svg := parseSVG(t, raw)
		// Five replayed panels.
		if svg.Width != "900" || svg.Height != strconv.Itoa(headHeight+5*panelHeight) ||
			svg.ViewBox != "0 0 900 "+svg.Height {
			t.Fatalf("picture %s x %s, viewBox %q", svg.Width, svg.Height, svg.ViewBox)
		}
		if len(svg.Panels) != len(doc.Rungs) {
			t.Fatalf("%d panels for %d rungs", len(svg.Panels), len(doc.Rungs))
		}
		for i, p := range svg.Panels {
			r := doc.Rungs[i]
			if p.Rung != r.Rung || p.Status != r.Status {
				t.Fatalf("panel %d: %s %s, want %s %s", i, p.Rung, p.Status, r.Rung, r.Status)
			}
			var lines, labels []svgElem
			for _, e := range p.Lines {
				if strings.Contains(e.Class, "threshold") {
					lines = append(lines, e)
				}
			}
			for _, e := range p.Texts {
				if e.Class == "threshold-label" {
					labels = append(labels, e)
				}
			}
			if len(lines) != len(r.Candidates) || len(labels) != len(r.Candidates) {
				t.Fatalf("%s: %d lines and %d labels for %d candidates", r.Rung, len(lines), len(labels), len(r.Candidates))
			}
			configured := 0
			for j, c := range r.Candidates {
				secs := strconv.FormatFloat(c.Seconds, 'f', -1, 64)
				if lines[j].Seconds != secs || labels[j].Seconds != secs {
					t.Fatalf("%s candidate %d: line %s label %s, want %s", r.Rung, j, lines[j].Seconds, labels[j].Seconds, secs)
				}
				want := human(time.Duration(c.Seconds * float64(time.Second)))
				if c.Configured {
					want += " (configured)"
					configured++
					if lines[j].Class != "threshold configured" {
						t.Fatalf("%s: the configured line is drawn as %q", r.Rung, lines[j].Class)
					}
				}
				// With nothing observed (pod_lost_floor here) a candidate has
				// no false reaps to count.
				if *r.Observed == 0 && labels[j].Text != want {
					t.Fatalf("%s candidate %d: label %q, want %q", r.Rung, j, labels[j].Text, want)
				}
				if *r.Observed > 0 && (!strings.HasPrefix(labels[j].Text, want+": ") ||
					!strings.HasSuffix(labels[j].Text, plural(c.FalseReaps, "false reap"))) {
					t.Fatalf("%s candidate %d: label %q, want %q and its false reaps", r.Rung, j, labels[j].Text, want)
				}
				// A vertical line at the candidate's place on the axis.
				if lines[j].X1 != lines[j].X2 || (j > 0 && !(atof(t, lines[j].X1) > atof(t, lines[j-1].X1))) {
					t.Fatalf("%s candidate %d: line from x %s to %s", r.Rung, j, lines[j].X1, lines[j].X2)
				}
			}
			tails := 1
			if *r.Observed == 0 {
				tails = 0
				if !strings.Contains(p.text(), "nothing observed") {
					t.Fatalf("%s: an empty panel does not say it is empty", r.Rung)
				}
			}
			if r.Status != statusReplayed || configured != 1 || len(p.Polylines) != tails || len(p.Circles) != *r.LostCount {
				t.Fatalf("%s %s: %d configured lines, %d tails, %d lost marks", r.Rung, r.Status, configured, len(p.Polylines), len(p.Circles))
			}
		}
	})
}

// svgDoc is what a test reads back from the picture.
type svgDoc struct {
	XMLName xml.Name   `xml:"svg"`
	Width   string     `xml:"width,attr"`
	Height  string     `xml:"height,attr"`
	ViewBox string     `xml:"viewBox,attr"`
	Panels  []svgPanel `xml:"g"`
}

type svgPanel struct {
	Rung      string    `xml:"data-rung,attr"`
	Status    string    `xml:"data-status,attr"`
	Lines     []svgElem `xml:"line"`
	Texts     []svgElem `xml:"text"`
	Polylines []svgElem `xml:"polyline"`
	Circles   []svgElem `xml:"circle"`
}

type svgElem struct {
	Class   string `xml:"class,attr"`
	Seconds string `xml:"data-seconds,attr"`
	X1      string `xml:"x1,attr"`
	X2      string `xml:"x2,attr"`
	Text    string `xml:",chardata"`
}

func (p svgPanel) text() string {
	var b strings.Builder
	for _, t := range p.Texts {
		b.WriteString(t.Text + "\n")
	}
	return b.String()
}

func parseSVG(t *testing.T, raw []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	if err := xml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("the picture is not XML: %v", err)
	}
	if doc.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("the picture's root is %+v", doc.XMLName)
	}
	return doc
}

func atof(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
