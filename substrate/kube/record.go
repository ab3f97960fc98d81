package kube

import "github.com/dexaflow/reaper/substrate/kube/podrecord"

// The durable outcome record's format lives in package podrecord, which the
// agent imports without pulling in a Kubernetes client; these are its names
// as this package has always spelled them.

// RecordOutcome is the outcome an outcome record declares.
type RecordOutcome = podrecord.Outcome

// Record outcomes.
const (
	RecordSuccess    = podrecord.Success
	RecordFailed     = podrecord.Failed
	RecordReschedule = podrecord.Reschedule
	// RecordInfra is the infra marker (see podrecord.Infra).
	RecordInfra = podrecord.Infra
)

// RecordVersion is the version of the record format this package reads
// and writes.
const RecordVersion = podrecord.Version

// Record is the durable outcome record the task container leaves in its
// termination message (see package podrecord for the format).
type Record = podrecord.Record

// MaxRecordBytes is the most a termination message can hold (the kubelet
// truncates beyond it).
const MaxRecordBytes = podrecord.MaxBytes

// ParseRecord reads a termination message as an outcome record (see
// podrecord.Parse).
func ParseRecord(msg string) (Record, bool) { return podrecord.Parse(msg) }
