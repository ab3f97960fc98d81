// Package podrecord is the durable outcome record a task pod's agent leaves
// in its termination message, and the reader the kube substrate's sweep
// settles finished pods with.
//
// It is a package of its own, with no Kubernetes client in its imports, so
// that the agent (which writes records) does not carry client-go, and the
// substrate (which reads them) shares the one definition of the format.
//
// The record is one JSON object of at most MaxBytes bytes:
//
//	{"dexaflow_outcome":1,"outcome":"SUCCESS","run_id":"r1","task_id":"load_a","try":2,"epoch":1,"exit_code":0}
//	{"dexaflow_outcome":1,"outcome":"INFRA","run_id":"r1","task_id":"load_a","try":2,"epoch":1,"reason":"..."}
//
// dexaflow_outcome is the format's version (Version); outcome is one of the
// Outcome constants; run_id, task_id, try and epoch name the execution that
// wrote it; exit_code is the task's exit code, absent when the task's code
// never ran; reason is the agent's own words.
package podrecord

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dexaflow/reaper/sdk"
)

// Outcome is the outcome a record declares.
type Outcome string

// Record outcomes.
const (
	Success    Outcome = "SUCCESS"
	Failed     Outcome = "FAILED"
	Reschedule Outcome = "RESCHEDULE"
	// Infra is the infra marker: the attempt ended before the task's code
	// ran because the control plane never answered. The agent writes it
	// with a reason of its own and no exit code.
	Infra Outcome = "INFRA"
)

// Version is the version of the record format this package reads and
// writes.
const Version = 1

// MaxBytes is the most a termination message can hold (the kubelet
// truncates beyond it).
const MaxBytes = 4096

// Record is the durable outcome record the task container leaves in its
// termination message.
type Record struct {
	// Version is the format's version; Encode sets it.
	Version int     `json:"dexaflow_outcome"`
	Outcome Outcome `json:"outcome"`
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

// For is an empty record of attempt a with outcome o.
func For(a sdk.Attempt, o Outcome) Record {
	return Record{Outcome: o, RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch}
}

// Attempt is the attempt the record names.
func (r Record) Attempt() sdk.Attempt {
	return sdk.Attempt{RunID: r.RunID, TaskID: r.TaskID, Try: r.Try, Epoch: r.Epoch}
}

// Encode renders the record as the termination message the agent writes.
func (r Record) Encode() (string, error) {
	r.Version = Version
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encoding the outcome record of %s: %w", r.Attempt(), err)
	}
	if len(b) > MaxBytes {
		return "", fmt.Errorf("encoding the outcome record of %s: %d bytes, over the termination message's %d",
			r.Attempt(), len(b), MaxBytes)
	}
	return string(b), nil
}

// Parse reads a termination message as an outcome record. ok is false for
// anything else: an empty message, a task's own text, another version, an
// unknown outcome, or a record without its attempt. Such a message is no
// record, and the pod settles by what the cluster says.
func Parse(msg string) (Record, bool) {
	msg = strings.TrimSpace(msg)
	if !strings.HasPrefix(msg, "{") {
		return Record{}, false
	}
	var r Record
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return Record{}, false
	}
	if r.Version != Version || r.RunID == "" || r.TaskID == "" {
		return Record{}, false
	}
	switch r.Outcome {
	case Success, Failed, Reschedule, Infra:
		return r, true
	}
	return Record{}, false
}

// HonoredInfra reports whether an infra-marked record has the shape only
// the agent writes: a reason of its own and no exit code. Any other infra
// marker is treated as a task failure.
func (r Record) HonoredInfra() bool {
	return r.Outcome == Infra && r.ExitCode == nil && strings.TrimSpace(r.Reason) != ""
}

// AgentStopped is the reason the agent gives a FAILED record when it was
// stopped from outside (SIGTERM) before its task finished: the pod was
// deleted, evicted or shut down under it. Such a record says that the task
// was stopped, not why.
const AgentStopped = "agent_stopped"

// StoppedFromOutside reports whether the record is the agent's own
// "stopped from outside" failure: FAILED, no exit code, and a reason that
// is AgentStopped or starts with it.
func (r Record) StoppedFromOutside() bool {
	reason := strings.TrimSpace(r.Reason)
	return r.Outcome == Failed && r.ExitCode == nil &&
		(reason == AgentStopped || strings.HasPrefix(reason, AgentStopped+":"))
}
