package ctl

import (
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// The JSON documents of -json. Field names follow the board's columns (a
// public contract); times are RFC 3339, null when the column is NULL;
// durations are seconds.

// timeOrNil turns a zero time into null.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

type attemptJSON struct {
	RunID                    string     `json:"run_id"`
	TaskID                   string     `json:"task_id"`
	Try                      int32      `json:"try_number"`
	Epoch                    int32      `json:"attempt_epoch"`
	State                    string     `json:"state"`
	Executor                 string     `json:"executor"`
	QueuedAt                 *time.Time `json:"queued_at"`
	RunningAt                *time.Time `json:"running_at"`
	LastHeartbeatAt          *time.Time `json:"last_heartbeat_at"`
	ReleasedAt               *time.Time `json:"released_at"`
	EndedAt                  *time.Time `json:"ended_at"`
	LastFailureKind          string     `json:"last_failure_kind,omitempty"`
	FailureReason            string     `json:"failure_reason,omitempty"`
	ErrorMessage             string     `json:"error_message,omitempty"`
	InfraMarkedAt            *time.Time `json:"infra_marked_at"`
	InfraConfirmedAt         *time.Time `json:"infra_confirmed_at"`
	InfraBudget              int32      `json:"infra_budget"`
	InfraUsed                int32      `json:"infra_used"`
	Retries                  int32      `json:"retries"`
	MaxRetries               int32      `json:"max_retries"`
	WarmWorker               string     `json:"warm_worker,omitempty"`
	DispatchUnavailableSince *time.Time `json:"dispatch_unavailable_since"`
	HeldAt                   *time.Time `json:"held_at"`
	Command                  string     `json:"command,omitempty"`
	ExecutionTimeoutSeconds  float64    `json:"execution_timeout_seconds,omitempty"`
	UpdatedAt                time.Time  `json:"updated_at"`
	CredentialMintedAt       *time.Time `json:"credential_minted_at"`
	CredentialRenewedAt      *time.Time `json:"credential_renewed_at"`
	CredentialCappedAt       *time.Time `json:"credential_capped_at"`
}

func attemptOf(ti board.TaskInstance) attemptJSON {
	return attemptJSON{
		RunID: ti.RunID, TaskID: ti.TaskID, Try: ti.Try, Epoch: ti.Epoch, State: ti.State, Executor: ti.Executor,
		QueuedAt: timeOrNil(ti.QueuedAt), RunningAt: timeOrNil(ti.RunningAt),
		LastHeartbeatAt: timeOrNil(ti.LastHeartbeatAt), ReleasedAt: timeOrNil(ti.ReleasedAt),
		EndedAt: timeOrNil(ti.EndedAt), LastFailureKind: ti.LastFailureKind, FailureReason: ti.FailureReason,
		ErrorMessage: ti.ErrorMessage, InfraMarkedAt: timeOrNil(ti.InfraMarkedAt),
		InfraConfirmedAt: timeOrNil(ti.InfraConfirmedAt), InfraBudget: ti.InfraBudget, InfraUsed: ti.InfraUsed,
		Retries: ti.Retries, MaxRetries: ti.MaxRetries, WarmWorker: ti.WarmWorker,
		DispatchUnavailableSince: timeOrNil(ti.DispatchUnavailableSince), HeldAt: timeOrNil(ti.HeldAt),
		Command: ti.Command, ExecutionTimeoutSeconds: ti.ExecutionTimeout.Seconds(), UpdatedAt: ti.UpdatedAt.UTC(),
		CredentialMintedAt: timeOrNil(ti.CredentialMintedAt), CredentialRenewedAt: timeOrNil(ti.CredentialRenewedAt),
		CredentialCappedAt: timeOrNil(ti.CredentialCappedAt),
	}
}

type runJSON struct {
	RunID        string         `json:"run_id"`
	DagID        string         `json:"dag_id"`
	State        string         `json:"state"`
	StartedAt    *time.Time     `json:"started_at"`
	EndedAt      *time.Time     `json:"ended_at"`
	ErrorMessage string         `json:"error_message,omitempty"`
	UpdatedAt    time.Time      `json:"updated_at"`
	TaskCount    int            `json:"task_count"`
	Tasks        map[string]int `json:"tasks"`
	Held         int            `json:"held"`
	Attempts     []attemptJSON  `json:"attempts,omitempty"`
}

func runOf(r board.RunSummary) runJSON {
	tasks := r.Tasks
	if tasks == nil {
		tasks = map[string]int{}
	}
	return runJSON{
		RunID: r.RunID, DagID: r.DagID, State: r.State, StartedAt: timeOrNil(r.StartedAt),
		EndedAt: timeOrNil(r.EndedAt), ErrorMessage: r.ErrorMessage, UpdatedAt: r.UpdatedAt.UTC(),
		TaskCount: total(tasks), Tasks: tasks, Held: r.Held,
	}
}

type runBriefJSON struct {
	RunID        string     `json:"run_id"`
	DagID        string     `json:"dag_id"`
	State        string     `json:"state"`
	StartedAt    *time.Time `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at"`
	ErrorMessage string     `json:"error_message,omitempty"`
}

func runBriefOf(r board.Run) runBriefJSON {
	return runBriefJSON{RunID: r.RunID, DagID: r.DagID, State: r.State, StartedAt: timeOrNil(r.StartedAt),
		EndedAt: timeOrNil(r.EndedAt), ErrorMessage: r.ErrorMessage}
}

type leaderJSON struct {
	Name      string     `json:"name"`
	Term      int64      `json:"term"`
	Holder    string     `json:"holder,omitempty"`
	Held      bool       `json:"held"`
	ExpiresAt *time.Time `json:"expires_at"`
}

type decisionJSON struct {
	ID       int64             `json:"id"`
	At       time.Time         `json:"at"`
	Term     int64             `json:"term"`
	Holder   string            `json:"holder,omitempty"` // the replica that wrote it
	Reaper   string            `json:"reaper"`
	Label    string            `json:"label"`
	RunID    string            `json:"run_id"`
	TaskID   string            `json:"task_id,omitempty"`
	Try      *int32            `json:"try_number,omitempty"`
	Epoch    *int32            `json:"attempt_epoch,omitempty"`
	Outcome  string            `json:"outcome"`
	Applied  bool              `json:"applied"`
	DryRun   bool              `json:"dry_run"`
	Detail   string            `json:"detail,omitempty"`
	Evidence map[string]string `json:"evidence"`
	// Verdict is the shadow verdict on the decision, once scored.
	Verdict *verdictJSON `json:"verdict,omitempty"`
}

type verdictJSON struct {
	Verdict  string            `json:"verdict"`
	At       time.Time         `json:"at"`
	Term     int64             `json:"term"`
	Evidence map[string]string `json:"evidence"`
}

func decisionOf(r board.AuditRecord) decisionJSON {
	d := decisionJSON{
		ID: r.ID, At: r.At.UTC(), Term: r.Term, Holder: r.Holder, Reaper: r.Reaper, Label: r.Label,
		RunID: r.Attempt.RunID, TaskID: r.Attempt.TaskID, Outcome: outcome(r),
		Applied: r.Applied, DryRun: r.DryRun, Detail: r.Detail, Evidence: r.Evidence,
	}
	if d.Evidence == nil {
		d.Evidence = map[string]string{}
	}
	if r.Attempt.TaskID != "" {
		try, epoch := r.Attempt.Try, r.Attempt.Epoch
		d.Try, d.Epoch = &try, &epoch
	}
	if v := r.Verdict; v.Word != "" {
		d.Verdict = &verdictJSON{Verdict: v.Word, At: v.At.UTC(), Term: v.Term, Evidence: v.Evidence}
		if d.Verdict.Evidence == nil {
			d.Verdict.Evidence = map[string]string{}
		}
	}
	return d
}

type logLineJSON struct {
	Try   int32     `json:"try_number"`
	Epoch int32     `json:"attempt_epoch"`
	At    time.Time `json:"at"`
	Line  string    `json:"line"`
}

func logLineOf(l sdk.LogLine) logLineJSON {
	return logLineJSON{Try: l.Try, Epoch: l.Epoch, At: l.At.UTC(), Line: l.Line}
}
