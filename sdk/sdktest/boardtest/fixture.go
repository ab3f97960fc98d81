// Package boardtest is the board's conformance suite: one table of the
// board's rules (listings, mark guards, the orphan-run predicate and its
// atomic re-check, the reconciler's writes) that every sdk.Board must pass.
// The Postgres board (package board) and the in-memory board (sdktest.Board)
// both run it, so the two cannot drift:
//
//	func TestConformance(t *testing.T) { boardtest.Run(t, newFixture) }
//
// A board under test is reached through a Fixture: the board itself plus
// the few ways a test needs to seed rows and move the world around it.
package boardtest

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// T0 is "now" in every case: cases move time by offsets from it.
func T0() time.Time { return time.Date(2030, time.January, 7, 9, 0, 0, 0, time.UTC) }

// Row is a task instance as a case seeds it and reads it back. Zero times
// stand for NULL.
type Row struct {
	sdk.Attempt
	State            string
	Executor         string // empty: lite
	QueuedAt         time.Time
	RunningAt        time.Time
	LastHeartbeatAt  time.Time
	ReleasedAt       time.Time
	EndedAt          time.Time
	LastFailureKind  string
	FailureReason    string
	InfraMarkedAt    time.Time
	InfraConfirmedAt time.Time
	// InfraBudget and InfraUsed are the infra re-places allowed and spent
	// (both zero: no budget, an infra failure is not re-placed).
	InfraBudget  int32
	InfraUsed    int32
	ErrorMessage string
	Held         bool
	// PodUID is the pod UID recorded for the attempt (kube). It is seeded,
	// not read back.
	PodUID string
	// CredentialMintedAt is the recorded mint of the attempt's credential.
	// It is seeded, not read back.
	CredentialMintedAt time.Time
	// CredentialExchangedAt is when the attempt's bootstrap token was
	// exchanged (zero: not).
	CredentialExchangedAt time.Time
	// WarmWorker is the warm worker the attempt is bound to (warm). It is
	// seeded, not read back.
	WarmWorker string
	// Sensor is the task's sensor declaration and the stamps its bounds
	// count from (zero: not a sensor).
	Sensor sdk.Sensor
	// Retries is how many retries the task has left.
	Retries int32
	// PodMissingMax and PodMissingSince are the attempt's pod cache history
	// (RecordPodSightings: 0 and zero when none). They are read back, not
	// seeded.
	PodMissingMax   time.Duration
	PodMissingSince time.Time
}

// Ceiling is the credential ceiling every board under test is made with:
// a settlement refuses a sensor's reschedule at or past it, counted from the
// first dispatch of the try.
const Ceiling = time.Hour

// RunRow is a run as a case seeds it.
type RunRow struct {
	RunID     string
	State     string
	StartedAt time.Time
}

// Fixture is one fresh board under test, with a current leadership term
// whose lease runs past T0 by a day.
type Fixture interface {
	// Board is the board under test.
	Board() sdk.Board
	// Term is the current leadership term.
	Term() int64
	// PutRun inserts a run. A row put for a run that does not exist
	// creates it running, started a day before T0.
	PutRun(r RunRow)
	// Put inserts (or replaces) a task instance.
	Put(r Row)
	// Row reads a task instance back; false when it does not exist.
	Row(runID, taskID string) (Row, bool)
	// RunState reads a run's state back.
	RunState(runID string) string
	// Log returns the try log lines of an attempt, in order.
	Log(a sdk.Attempt) []string
	// Depose starts a newer term: Term is no longer current.
	Depose()
	// ExpireLease makes the current term's lease expire at at.
	ExpireLease(at time.Time)
	// LockRun makes another transaction hold the rows of a run until the
	// test ends.
	LockRun(runID string)
	// ExchangeBootstrap records the exchange of a's bootstrap credential,
	// minted at mintedAt, at at, through the board's writer (the attempt
	// API's write), and answers "exchanged", "spent" or "moved_on".
	ExchangeBootstrap(a sdk.Attempt, mintedAt, at time.Time) string
	// RecordWarmClaim records a warm worker's claim, as the attempt API
	// records an accepted one.
	RecordWarmClaim(worker string, c sdktest.WarmClaim)
}

// Memory returns a Fixture over a fresh in-memory board (sdktest.Board).
func Memory(t *testing.T) Fixture {
	t.Helper()
	b := sdktest.NewBoard()
	b.SetLease(T0().Add(24 * time.Hour))
	b.SetCredentialCeiling(Ceiling)
	return &memory{b: b}
}

type memory struct{ b *sdktest.Board }

func (m *memory) Board() sdk.Board { return m.b }
func (m *memory) Term() int64      { return m.b.Term() }

func (m *memory) PutRun(r RunRow) {
	m.b.PutRun(sdktest.Run{RunID: r.RunID, DagID: "dag", State: r.State, StartedAt: r.StartedAt})
}

func (m *memory) Put(r Row) {
	if _, ok := m.b.Run(r.RunID); !ok {
		m.PutRun(RunRow{RunID: r.RunID, State: sdk.RunRunning, StartedAt: T0().Add(-24 * time.Hour)})
	}
	if r.Try == 0 {
		r.Try = 1
	}
	m.b.Put(sdktest.TaskInstance{RunID: r.RunID, TaskID: r.TaskID, Try: r.Try, Epoch: r.Epoch, State: r.State,
		Executor: r.Executor, QueuedAt: r.QueuedAt, RunningAt: r.RunningAt, LastHeartbeatAt: r.LastHeartbeatAt,
		ReleasedAt: r.ReleasedAt, EndedAt: r.EndedAt, LastFailureKind: r.LastFailureKind, MarkReason: r.FailureReason,
		InfraMarkedAt: r.InfraMarkedAt, InfraConfirmedAt: r.InfraConfirmedAt, InfraBudget: r.InfraBudget, InfraUsed: r.InfraUsed,
		ErrorMessage: r.ErrorMessage, Held: r.Held, PodUID: r.PodUID, WarmWorker: r.WarmWorker,
		CredentialMintedAt: r.CredentialMintedAt, CredentialExchangedAt: r.CredentialExchangedAt,
		Sensor: r.Sensor, Retries: r.Retries})
}

func (m *memory) Row(runID, taskID string) (Row, bool) {
	t, ok := m.b.Task(runID, taskID)
	if !ok {
		return Row{}, false
	}
	return Row{Attempt: t.Attempt(), State: t.State, Executor: t.Executor, QueuedAt: t.QueuedAt,
		RunningAt: t.RunningAt, LastHeartbeatAt: t.LastHeartbeatAt, ReleasedAt: t.ReleasedAt, EndedAt: t.EndedAt,
		LastFailureKind: t.LastFailureKind, FailureReason: t.MarkReason, InfraMarkedAt: t.InfraMarkedAt,
		InfraConfirmedAt: t.InfraConfirmedAt, InfraBudget: t.InfraBudget, InfraUsed: t.InfraUsed,
		ErrorMessage: t.ErrorMessage, Held: t.Held, CredentialExchangedAt: t.CredentialExchangedAt,
		Sensor: t.Sensor, Retries: t.Retries, PodMissingMax: t.PodMissingMax, PodMissingSince: t.PodMissingSince}, true
}

func (m *memory) RunState(runID string) string {
	r, _ := m.b.Run(runID)
	return r.State
}

func (m *memory) Log(a sdk.Attempt) []string { return m.b.Log(a) }
func (m *memory) Depose()                    { m.b.SetTerm(m.b.Term() + 1) }
func (m *memory) ExpireLease(at time.Time)   { m.b.SetLease(at) }
func (m *memory) LockRun(runID string)       { m.b.LockRun(runID, true) }

func (m *memory) ExchangeBootstrap(a sdk.Attempt, mintedAt, at time.Time) string {
	return m.b.ExchangeBootstrap(a, mintedAt, at)
}

func (m *memory) RecordWarmClaim(worker string, c sdktest.WarmClaim) {
	m.b.RecordWarmClaim(worker, c)
}
