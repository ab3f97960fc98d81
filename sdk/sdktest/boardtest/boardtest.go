package boardtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// Run runs the conformance suite against the boards newFixture makes, one
// fresh board per case. Each case is a subtest named for the rule it
// proves.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture) {
	t.Helper()
	for _, group := range []struct {
		name  string
		cases map[string]func(t *testing.T, f Fixture)
	}{
		{"Listing", listingCases()},
		{"Mark", markCases()},
		{"OrphanRun", orphanCases()},
		{"Reconcile", reconcileCases()},
		{"PodSightings", sightingCases()},
		{"Exchange", exchangeCases()},
		{"Sensor", sensorCases()},
	} {
		t.Run(group.name, func(t *testing.T) {
			t.Parallel()
			names := make([]string, 0, len(group.cases))
			for name := range group.cases {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					group.cases[name](t, newFixture(t))
				})
			}
		})
	}
}

func at(d time.Duration) time.Time { return T0().Add(d) }

// attempt is the first attempt of a task.
func attempt(runID, taskID string) sdk.Attempt {
	return sdk.Attempt{RunID: runID, TaskID: taskID, Try: 1}
}

// running seeds a running attempt that entered running at runningAt and
// last heartbeated at hb (zero: never).
func running(f Fixture, runID, taskID string, runningAt, hb time.Time) sdk.Attempt {
	a := attempt(runID, taskID)
	f.Put(Row{Attempt: a, State: sdk.StateRunning, QueuedAt: runningAt.Add(-time.Minute), RunningAt: runningAt,
		LastHeartbeatAt: hb})
	return a
}

// provisional seeds a kube attempt failed with a provisional infra mark
// (reason) made at markedAt.
func provisional(f Fixture, runID, taskID, reason string, markedAt time.Time) sdk.Attempt {
	a := attempt(runID, taskID)
	f.Put(Row{Attempt: a, State: sdk.StateFailed, Executor: sdk.ExecutorKube, QueuedAt: markedAt.Add(-time.Hour),
		RunningAt: markedAt.Add(-50 * time.Minute), EndedAt: markedAt, LastFailureKind: sdk.FailureInfra,
		FailureReason: reason, InfraMarkedAt: markedAt, ErrorMessage: reason + ": lost"})
	return a
}

func row(t *testing.T, f Fixture, a sdk.Attempt) Row {
	t.Helper()
	r, ok := f.Row(a.RunID, a.TaskID)
	if !ok {
		t.Fatalf("no row for %s", a)
	}
	return r
}

// unchanged fails t when the row of a differs from before.
func unchanged(t *testing.T, f Fixture, a sdk.Attempt, before Row) {
	t.Helper()
	if after := row(t, f, a); !sameRow(before, after) {
		t.Fatalf("a no-op wrote the row:\nbefore %+v\nafter  %+v", before, after)
	}
}

func sameRow(x, y Row) bool {
	return x.Attempt == y.Attempt && x.State == y.State && x.Executor == y.Executor &&
		x.QueuedAt.Equal(y.QueuedAt) && x.RunningAt.Equal(y.RunningAt) && x.LastHeartbeatAt.Equal(y.LastHeartbeatAt) &&
		x.ReleasedAt.Equal(y.ReleasedAt) && x.EndedAt.Equal(y.EndedAt) && x.LastFailureKind == y.LastFailureKind &&
		x.FailureReason == y.FailureReason && x.InfraMarkedAt.Equal(y.InfraMarkedAt) &&
		x.InfraConfirmedAt.Equal(y.InfraConfirmedAt) && x.ErrorMessage == y.ErrorMessage && x.Held == y.Held &&
		x.InfraBudget == y.InfraBudget && x.InfraUsed == y.InfraUsed && x.Retries == y.Retries &&
		x.CredentialExchangedAt.Equal(y.CredentialExchangedAt) &&
		x.Sensor.Declared == y.Sensor.Declared && x.Sensor.Timeout == y.Sensor.Timeout &&
		x.Sensor.FirstPokeAt.Equal(y.Sensor.FirstPokeAt) && x.Sensor.TryDispatchedAt.Equal(y.Sensor.TryDispatchedAt)
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// one asserts a batch answered exactly one result, about a, and returns it.
func one(t *testing.T, a sdk.Attempt, res []sdk.MarkResult, err error) sdk.MarkResult {
	t.Helper()
	if err != nil {
		t.Fatalf("write %s: %v", a, err)
	}
	if len(res) != 1 || res[0].Attempt != a {
		t.Fatalf("results %+v do not answer the request about %s", res, a)
	}
	return res[0]
}

func applied(t *testing.T, r sdk.MarkResult) {
	t.Helper()
	if !r.Applied || r.NoopReason != "" {
		t.Fatalf("result %+v, want applied", r)
	}
}

func noop(t *testing.T, r sdk.MarkResult, reason string) {
	t.Helper()
	if r.Applied || r.NoopReason != reason {
		t.Fatalf("result %+v, want a no-op for %q", r, reason)
	}
}

func keys(cs []sdk.Candidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.RunID + "/" + c.TaskID
	}
	return out
}

func runKeys(rs []sdk.RunCandidate) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.RunID
	}
	return out
}

func id(prefix string, i int) string { return fmt.Sprintf("%s%03d", prefix, i) }
