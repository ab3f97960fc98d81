package ctl

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

func TestStats(t *testing.T) {
	t.Parallel()

	t.Run("NearestRankOnAKnownDistribution", func(t *testing.T) {
		t.Parallel()
		var ds []time.Duration
		for i := 100; i >= 1; i-- { // given out of order
			ds = append(ds, time.Duration(i)*time.Second)
		}
		got := summarize(ds)
		want := summary{Count: 100, Median: 50 * time.Second, P99: 99 * time.Second, P999: 100 * time.Second,
			Max: 100 * time.Second}
		if got != want {
			t.Fatalf("summary %+v, want %+v", got, want)
		}
		if ds[0] != 100*time.Second {
			t.Fatal("summarize sorted its input")
		}
	})

	t.Run("P999NeedsAThousandSamplesToDifferFromMax", func(t *testing.T) {
		t.Parallel()
		var ds []time.Duration
		for i := 1; i <= 2000; i++ {
			ds = append(ds, time.Duration(i)*time.Millisecond)
		}
		s := summarize(ds)
		if s.Median != time.Second || s.P99 != 1980*time.Millisecond || s.P999 != 1998*time.Millisecond ||
			s.Max != 2*time.Second {
			t.Fatalf("summary %+v", s)
		}
		if s := summarize(ds[:999]); s.P999 != s.Max {
			t.Fatalf("with 999 samples p99.9 %v is not the max %v", s.P999, s.Max)
		}
	})

	t.Run("OneSampleAndNone", func(t *testing.T) {
		t.Parallel()
		s := summarize([]time.Duration{7 * time.Second})
		if s.Count != 1 || s.Median != 7*time.Second || s.P999 != 7*time.Second {
			t.Fatalf("summary %+v", s)
		}
		if (summarize(nil) != summary{}) {
			t.Fatal("an empty sample has a summary")
		}
	})

	t.Run("SuggestionIsTenTimesTheMedianNeverUnderTheTail", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			s    summary
			want time.Duration
		}{
			{summary{Median: 50 * time.Second, P999: 100 * time.Second}, 500 * time.Second},
			{summary{Median: time.Minute, P999: 25 * time.Minute}, 25 * time.Minute}, // the tail wins
			{summary{Median: 3 * time.Millisecond, P999: 4 * time.Millisecond}, 30 * time.Millisecond},
			{summary{Median: 1234 * time.Millisecond, P999: 2 * time.Second}, 13 * time.Second}, // 12.34s, up to the second
			{summary{Median: 61 * time.Second, P999: 0}, 11 * time.Minute},                      // 10m10s, up to the minute
		}
		for _, c := range cases {
			if got := suggest(c.s); got != c.want {
				t.Errorf("suggest(%+v) = %v, want %v", c.s, got, c.want)
			}
		}
	})

	t.Run("RoundUp", func(t *testing.T) {
		t.Parallel()
		cases := map[time.Duration]time.Duration{
			0:                       0,
			1 * time.Millisecond:    10 * time.Millisecond,
			990 * time.Millisecond:  990 * time.Millisecond,
			1001 * time.Millisecond: 2 * time.Second,
			61 * time.Second:        70 * time.Second,
			10*time.Minute + 1:      11 * time.Minute,
			time.Hour + 1:           time.Hour + 10*time.Minute,
		}
		for in, want := range cases {
			if got := roundUp(in); got != want {
				t.Errorf("roundUp(%v) = %v, want %v", in, got, want)
			}
		}
	})

	t.Run("HumanDurations", func(t *testing.T) {
		t.Parallel()
		cases := map[time.Duration]string{
			0:                                 "0s",
			850 * time.Microsecond:            "850µs",
			350 * time.Millisecond:            "350ms",
			999600 * time.Microsecond:         "1s",
			12500 * time.Millisecond:          "12.5s",
			42 * time.Second:                  "42s",
			59960 * time.Millisecond:          "1m",
			3*time.Minute + 12*time.Second:    "3m12s",
			5 * time.Minute:                   "5m",
			time.Hour - time.Millisecond:      "1h",
			2*time.Hour + 5*time.Minute:       "2h5m",
			99 * time.Minute:                  "1h39m",
			500 * time.Minute:                 "8h20m",
			3*24*time.Hour + 4*time.Hour:      "3d4h",
			7 * 24 * time.Hour:                "7d",
			-(3*time.Minute + 12*time.Second): "-3m12s",
		}
		for in, want := range cases {
			if got := human(in); got != want {
				t.Errorf("human(%v) = %q, want %q", in, got, want)
			}
		}
	})
}

// tuneBoard fills a board with 100 successful attempts: attempt i ran i
// minutes after waiting i seconds queued. Attempts 1..97 belong to a run
// still running; 98, 99 and 100 each to a successful run that ended 5, 6
// and 7 seconds after its task.
func tuneBoard(t *testing.T, extra string) *bundle {
	t.Helper()
	b := setup(t, extra)
	var ids []string
	for i := 1; i <= 97; i++ {
		ids = append(ids, fmt.Sprintf("t%03d", i))
	}
	b.createRun(t, "load", base.Add(-3*time.Hour), ids...)
	for i := 1; i <= 100; i++ {
		runID, taskID := "load", fmt.Sprintf("t%03d", i)
		if i > 97 {
			runID, taskID = fmt.Sprintf("done%d", i), "t"
			b.createRun(t, runID, base.Add(-3*time.Hour), taskID)
		}
		ended := base.Add(-time.Duration(i) * time.Second)
		running := ended.Add(-time.Duration(i) * time.Minute)
		b.succeeded(t, first(runID, taskID), running.Add(-time.Duration(i)*time.Second), running, ended)
		if i > 97 {
			lag := time.Duration(i-93) * time.Second
			if ok, err := b.w.FinishRun(context.Background(), runID, sdk.RunSuccess, "", ended.Add(lag)); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
	}
	return b
}

func TestTune(t *testing.T) {
	t.Parallel()

	t.Run("ArithmeticAndTheBelowTheTailFlag", func(t *testing.T) {
		t.Parallel()
		b := tuneBoard(t, "")
		r := b.ctl(t, "tune").ok(t)
		golden(t, r.stdout, `
observed: what ended in the last 7d, the newest 10000 samples of each at most

MEASURE           FROM                                        SAMPLES  MEDIAN  P99    P99.9  MAX    SUGGESTED
attempt duration  running -> ended, successful attempts       100      50m     1h39m  1h40m  1h40m  8h20m
queue wait        queued -> running, the same attempts        100      50s     1m39s  1m40s  1m40s  8m20s
run settle lag    last task activity -> end, successful runs  3        6s      7s     7s     7s     too few samples (3 < 20)

THRESHOLD                             CONFIGURED  AGAINST           X MEDIAN  SUGGESTED  VERDICT
auth.max_attempt_credential_lifetime  1h          attempt duration  1.2x      8h20m      BELOW THE OBSERVED TAIL (p99.9 1h40m, max 1h40m)
dispatch_lost                         3m          queue wait        3.6x      8m20s      short: above the tail but under 10 x the median (8m20s)
orphan_run                            5m          run settle lag    50x       -          too few samples to judge (3 < 20)
agent_lost                            1m30s       -                 -         -          not derivable: it bounds heartbeat silences, not durations (replayed below)

1 threshold below the observed tail: auth.max_attempt_credential_lifetime
note: suggested = max(10 x median, p99.9), rounded up; percentiles by nearest rank
note: orphan_run is compared with runs, not attempts: a running attempt keeps its run alive, so what it bounds is a run's quiet time between its last task settling and the run being finished
note: auth.max_attempt_credential_lifetime is below the observed tail: an attempt still running at the ceiling is ended as credential_ceiling, so observed attempt durations would have been cut short

replayed over the last 7d (reaperctl replay -rung RUNG names the attempts behind each number)

RUNG                CONFIGURED  FALSE REAPS AT IT  LARGEST OBSERVED                 NO FALSE REAP FROM            MARGIN
agent_lost          1m30s       99                 1h40m (done100/t try 1 epoch 0)  -                             -
dispatch_lost       3m          0                  1m40s (done100/t try 1 epoch 0)  1m40s (the tail, rounded up)  0s
pod_lost_floor      1m          0                  -                                -                             -
orphan_run          5m          4                  1h20m (load/t097 try 1 epoch 0)  1h20m (the tail, rounded up)  14s
credential_ceiling  1h          41                 1h42m (done100/t try 1 epoch 0)  1h50m (the tail, rounded up)  8m20s
note: agent_lost: the observed tail needs 1h40m, which breaks the ladder (agent_lost 1h40m breaks the timing ladder: settling_grace (180s) must be greater than agent_lost (100m))
note: pod_lost_floor: nothing observed in the window: no attempts to judge a threshold by
`)
	})

	// The pods' own start (created -> running) is shown where the kube
	// runner recorded pods, and only there: a Lite board has no such row.
	t.Run("PodStartWhereKubePodsWereRecorded", func(t *testing.T) {
		t.Parallel()
		b := tuneBoard(t, "")
		// Attempts t001..t010 had pods created i seconds before running.
		if _, err := b.pool.Exec(context.Background(), `UPDATE task_instances
            SET pod_created_at = running_at - make_interval(secs => substr(task_id, 2)::int)
            WHERE run_id = 'load' AND substr(task_id, 2)::int <= 10`); err != nil {
			t.Fatal(err)
		}
		var doc tuneJSON
		b.ctl(t, "tune", "-json", "-min-samples", "3").ok(t).decode(t, &doc)
		if len(doc.Measures) != 4 {
			t.Fatalf("measures %+v, want the pod start fourth", doc.Measures)
		}
		pod := doc.Measures[3]
		if pod.Name != measurePodStart || pod.Count != 10 || *pod.MedianSeconds != 5 || *pod.MaxSeconds != 10 {
			t.Fatalf("pod start %+v", pod)
		}
		var lite tuneJSON
		tuneBoard(t, "").ctl(t, "tune", "-json").ok(t).decode(t, &lite)
		if len(lite.Measures) != 3 {
			t.Fatalf("a board with no pods shows %d measures", len(lite.Measures))
		}
	})

	t.Run("JSONDocument", func(t *testing.T) {
		t.Parallel()
		b := tuneBoard(t, "")
		var doc tuneJSON
		b.ctl(t, "tune", "-json", "-window", "0", "-min-samples", "3").ok(t).decode(t, &doc)
		if doc.WindowSeconds != 0 || doc.MinSamples != 3 || len(doc.Measures) != 3 || len(doc.Thresholds) != 4 {
			t.Fatalf("document %+v", doc)
		}
		settle := doc.Measures[2]
		if settle.Name != measureRunSettle || settle.Count != 3 || !settle.Enough || *settle.MedianSeconds != 6 ||
			*settle.SuggestedSeconds != 60 {
			t.Fatalf("settle lag %+v", settle)
		}
		if len(doc.BelowTail) != 1 || doc.BelowTail[0] != keyCredentialCeiling {
			t.Fatalf("below tail %v", doc.BelowTail)
		}
		orphan := doc.Thresholds[2]
		if orphan.Key != "orphan_run" || orphan.Verdict != verdictOK || orphan.BelowTail || *orphan.TailSeconds != 7 ||
			*orphan.TimesMedian != 50 || orphan.ConfiguredSeconds != 300 {
			t.Fatalf("orphan_run %+v", orphan)
		}
		if lost := doc.Thresholds[3]; lost.Verdict != verdictNotDerivable || lost.Against != "" || lost.TailSeconds != nil {
			t.Fatalf("agent_lost %+v", lost)
		}
	})

	t.Run("FewSamplesStillFlagAThresholdUnderAnObservedValue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "ladder {\n  dispatch_lost = \"2s\"\n}\nauth {\n  max_attempt_credential_lifetime = \"0\"\n}\n")
		b.createRun(t, "r", base.Add(-time.Hour), "a", "b")
		b.succeeded(t, first("r", "a"), base.Add(-10*time.Minute), base.Add(-10*time.Minute+time.Second), base.Add(-9*time.Minute))
		b.succeeded(t, first("r", "b"), base.Add(-10*time.Minute), base.Add(-10*time.Minute+5*time.Second), base.Add(-9*time.Minute))
		var doc tuneJSON
		b.ctl(t, "tune", "-json").ok(t).decode(t, &doc)
		verdicts := map[string]string{}
		for _, th := range doc.Thresholds {
			verdicts[th.Key] = th.Verdict
		}
		want := map[string]string{keyCredentialCeiling: verdictDisabled, "dispatch_lost": verdictBelowTail,
			"orphan_run": verdictNoSamples, "agent_lost": verdictNotDerivable}
		for k, v := range want {
			if verdicts[k] != v {
				t.Errorf("%s: verdict %q, want %q", k, verdicts[k], v)
			}
		}
		if doc.Measures[0].Enough || doc.Measures[0].SuggestedSeconds != nil {
			t.Fatalf("a suggestion from two samples: %+v", doc.Measures[0])
		}
	})

	t.Run("EmptyBoard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		r := b.ctl(t, "tune", "-window", "1h").ok(t)
		for _, want := range []string{
			"observed: what ended in the last 1h,",
			"attempt duration  running -> ended, successful attempts       0        -       -    -      -    no samples",
			"no samples to compare with",
			"no configured threshold is below the observed tail",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Fatalf("output lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("SuggestionsThatBreakTheLadderAreSaidSo", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.createRun(t, "r", base.Add(-time.Hour), "a")
		b.succeeded(t, first("r", "a"), base.Add(-10*time.Minute), base.Add(-10*time.Minute), base.Add(-9*time.Minute))
		r := b.ctl(t, "tune", "-min-samples", "1").ok(t)
		// Ten one-minute medians suggest a 10m ceiling: not above attempt_token_ttl (10m).
		if !strings.Contains(r.stdout, "note: taken as they are, the suggestions break the timing ladder") ||
			!strings.Contains(r.stdout, "attempt_token_ttl") {
			t.Fatalf("no ladder note:\n%s", r.stdout)
		}
	})
	t.Run("TheReplaySummaryIsTheSmallestCandidateWithNoFalseReap", func(t *testing.T) {
		t.Parallel()
		b := replayBoard(t)
		var doc tuneJSON
		b.ctl(t, "tune", "-json").ok(t).decode(t, &doc)
		want := map[string]struct {
			zero, largest time.Duration
			atConfigured  int
			who           string
		}{
			rungAgentLost:    {5 * mins, 5 * mins, 3, "b"},
			rungDispatchLost: {7 * mins, 7 * mins, 2, "e"},
			rungOrphanRun:    {12 * mins, 12 * mins, 1, ""},
			rungCeiling:      {140 * mins, 140 * mins, 1, "x"},
		}
		if len(doc.Replay) != 5 {
			t.Fatalf("replay summary %+v", doc.Replay)
		}
		for _, r := range doc.Replay {
			if r.Rung == rungPodLostFloor {
				if r.Status != statusReplayed || *r.Observed != 0 || *r.FalseReapsAtConfigured != 0 ||
					r.SmallestZeroSeconds != nil || r.MarginSeconds != nil || !strings.Contains(r.Detail, "nothing observed") {
					t.Fatalf("pod_lost_floor %+v", r)
				}
				continue
			}
			w := want[r.Rung]
			if *r.SmallestZeroSeconds != w.zero.Seconds() || r.SmallestZeroSource != sourceTail || *r.MarginSeconds != 0 ||
				r.Largest.ValueSeconds != w.largest.Seconds() || r.Largest.TaskID != w.who ||
				*r.FalseReapsAtConfigured != w.atConfigured {
				t.Errorf("%s: %+v (largest %+v)", r.Rung, r, r.Largest)
			}
		}
	})

	t.Run("NoSuggestionWhereTheTailBreaksTheLadderOrNothingWasSeen", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.seedHistory(t, []histRun{{id: "r", state: sdk.RunRunning, started: hrs}}, []histAttempt{
			{run: "r", task: "a", try: 1, state: sdk.StateRunning, queued: 50 * mins, running: 49 * mins, beat: mins,
				gap: 4 * mins, at: mins},
		})
		var doc tuneJSON
		b.ctl(t, "tune", "-json").ok(t).decode(t, &doc)
		for _, r := range doc.Replay {
			switch r.Rung {
			case rungAgentLost:
				// A 4m silence: only 4m or more has no false reap, and
				// agent_lost must stay under settling_grace (3m).
				if r.SmallestZeroSeconds != nil || !strings.Contains(r.Detail, "the observed tail needs 4m, which breaks the ladder") {
					t.Fatalf("agent_lost %+v", r)
				}
			case rungCeiling:
				if *r.Observed != 0 || r.SmallestZeroSeconds != nil || r.Largest != nil ||
					!strings.Contains(r.Detail, "nothing observed in the window") {
					t.Fatalf("credential_ceiling %+v", r)
				}
			}
		}
	})
}
