package kube

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dexaflow/reaper/sdk"
)

// RecordOutcome is the outcome an outcome record declares.
type RecordOutcome string

// Record outcomes.
const (
	RecordSuccess    RecordOutcome = "SUCCESS"
	RecordFailed     RecordOutcome = "FAILED"
	RecordReschedule RecordOutcome = "RESCHEDULE"
	// RecordInfra is the infra marker: the attempt ended before the task's
	// code ran because the control plane never answered. The agent writes
	// it with a reason of its own and no exit code.
	RecordInfra RecordOutcome = "INFRA"
)

// RecordVersion is the version of the record format this package reads
// and writes.
const RecordVersion = 1

// Record is the durable outcome record the task container leaves in its
// termination message (see the package documentation for the format).
type Record struct {
	// Version is RecordVersion.
	Version int           `json:"dexaflow_outcome"`
	Outcome RecordOutcome `json:"outcome"`
	// The attempt that wrote the record.
	RunID  string `json:"run_id"`
	TaskID string `json:"task_id"`
	Try    int32  `json:"try"`
	Epoch  int32  `json:"epoch"`
	// ExitCode is the task's exit code; absent when the task's code never
	// ran (the infra marker).
	ExitCode *int32 `json:"exit_code,omitempty"`
	// Reason is the agent's own words: why the attempt failed, or for the
	// infra marker which answer never came.
	Reason string `json:"reason,omitempty"`
}

// Attempt is the attempt the record names.
func (r Record) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: r.RunID, TaskID: r.TaskID, Try: r.Try, Epoch: r.Epoch}
}

// Encode renders the record as the termination message the agent writes.
func (r Record) Encode() (string, error) {
	r.Version = RecordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encoding the outcome record of %s: %w", r.Attempt(), err)
	}
	if len(b) > MaxRecordBytes {
		return "", fmt.Errorf("encoding the outcome record of %s: %d bytes, over the termination message's %d",
			r.Attempt(), len(b), MaxRecordBytes)
	}
	return string(b), nil
}

// MaxRecordBytes is the most a termination message can hold (the kubelet
// truncates beyond it).
const MaxRecordBytes = 4096

// ParseRecord reads a termination message as an outcome record. ok is
// false for anything else: an empty message, a task's own text, another
// version, an unknown outcome, or a record without its attempt. Such a
// message is no record, and the pod settles by what the cluster says.
func ParseRecord(msg string) (Record, bool) {
	msg = strings.TrimSpace(msg)
	if !strings.HasPrefix(msg, "{") {
		return Record{}, false
	}
	var r Record
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return Record{}, false
	}
	if r.Version != RecordVersion || r.RunID == "" || r.TaskID == "" {
		return Record{}, false
	}
	switch r.Outcome {
	case RecordSuccess, RecordFailed, RecordReschedule, RecordInfra:
		return r, true
	}
	return Record{}, false
}

// honoredInfra reports whether an infra-marked record has the shape only
// the agent writes: a reason of its own and no exit code. Any other
// infra marker is treated as a task failure.
func (r Record) honoredInfra() bool {
	return r.Outcome == RecordInfra && r.ExitCode == nil && strings.TrimSpace(r.Reason) != ""
}
