package sdk

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dexaflow/reaper/sdk/ladder"
	pb "github.com/dexaflow/reaper/sdk/proto/reaperv1"
)

// The functions below translate between the Go types of this package and
// their protocol messages. A zero time.Time travels as an unset timestamp.

func tsToPB(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tsFromPB(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func durToPB(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func durFromPB(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

func attemptToPB(a Attempt) *pb.Attempt {
	return &pb.Attempt{RunId: a.RunID, TaskId: a.TaskID, TryNumber: a.Try, AttemptEpoch: a.Epoch}
}

func attemptFromPB(a *pb.Attempt) Attempt {
	if a == nil {
		return Attempt{}
	}
	return Attempt{RunID: a.RunId, TaskID: a.TaskId, Try: a.TryNumber, Epoch: a.AttemptEpoch}
}

func attemptsToPB(as []Attempt) []*pb.Attempt {
	out := make([]*pb.Attempt, len(as))
	for i, a := range as {
		out[i] = attemptToPB(a)
	}
	return out
}

func attemptsFromPB(as []*pb.Attempt) []Attempt {
	out := make([]Attempt, len(as))
	for i, a := range as {
		out[i] = attemptFromPB(a)
	}
	return out
}

func ladderToPB(l ladder.Ladder) *pb.Ladder {
	return &pb.Ladder{
		Heartbeat:            durToPB(l.Heartbeat),
		AgentLost:            durToPB(l.AgentLost),
		SettlingGrace:        durToPB(l.SettlingGrace),
		AttemptTokenTtl:      durToPB(l.AttemptTokenTTL),
		DispatchLost:         durToPB(l.DispatchLost),
		PodLostFloor:         durToPB(l.PodLostFloor),
		OrphanRun:            durToPB(l.OrphanRun),
		InfraConfirmValve:    durToPB(l.InfraConfirmValve),
		TaskTerminationGrace: durToPB(l.TaskTerminationGrace),
		MaintenanceInterval:  durToPB(l.MaintenanceInterval),
		CredentialCeiling:    durToPB(l.CredentialCeiling),
	}
}

func ladderFromPB(l *pb.Ladder) ladder.Ladder {
	if l == nil {
		return ladder.Ladder{}
	}
	return ladder.Ladder{
		Heartbeat:            durFromPB(l.Heartbeat),
		AgentLost:            durFromPB(l.AgentLost),
		SettlingGrace:        durFromPB(l.SettlingGrace),
		AttemptTokenTTL:      durFromPB(l.AttemptTokenTtl),
		DispatchLost:         durFromPB(l.DispatchLost),
		PodLostFloor:         durFromPB(l.PodLostFloor),
		OrphanRun:            durFromPB(l.OrphanRun),
		InfraConfirmValve:    durFromPB(l.InfraConfirmValve),
		TaskTerminationGrace: durFromPB(l.TaskTerminationGrace),
		MaintenanceInterval:  durFromPB(l.MaintenanceInterval),
		CredentialCeiling:    durFromPB(l.CredentialCeiling),
	}
}

func decisionsToPB(ds []Decision) []*pb.Decision {
	out := make([]*pb.Decision, len(ds))
	for i, d := range ds {
		out[i] = &pb.Decision{
			Reaper: d.Reaper, Label: d.Label, Attempt: attemptToPB(d.Attempt),
			Applied: d.Applied, DryRun: d.DryRun, Detail: d.Detail, Evidence: d.Evidence,
		}
	}
	return out
}

func decisionsFromPB(ds []*pb.Decision) []Decision {
	out := make([]Decision, len(ds))
	for i, d := range ds {
		out[i] = Decision{
			Reaper: d.Reaper, Label: d.Label, Attempt: attemptFromPB(d.Attempt),
			Applied: d.Applied, DryRun: d.DryRun, Detail: d.Detail, Evidence: d.Evidence,
		}
	}
	return out
}

// hoistEvidence removes from each decision the evidence entries that every
// decision shares (same key, same value) and returns them: a pass's
// decisions repeat the term, the edition, the thresholds and the policy,
// and sending them once keeps a large pass's response small.
func hoistEvidence(ds []*pb.Decision) map[string]string {
	if len(ds) < 2 || len(ds[0].Evidence) == 0 {
		return nil
	}
	common := map[string]string{}
	for k, v := range ds[0].Evidence {
		common[k] = v
	}
	for _, d := range ds[1:] {
		for k, v := range common {
			if dv, ok := d.Evidence[k]; !ok || dv != v {
				delete(common, k)
			}
		}
		if len(common) == 0 {
			return nil
		}
	}
	for _, d := range ds {
		rest := make(map[string]string, len(d.Evidence)-len(common))
		for k, v := range d.Evidence {
			if _, shared := common[k]; !shared {
				rest[k] = v
			}
		}
		d.Evidence = rest
	}
	return common
}

// mergeEvidence puts hoisted entries back into every decision.
func mergeEvidence(ds []Decision, common map[string]string) {
	if len(common) == 0 {
		return
	}
	for i := range ds {
		ev := make(map[string]string, len(ds[i].Evidence)+len(common))
		for k, v := range common {
			ev[k] = v
		}
		for k, v := range ds[i].Evidence {
			ev[k] = v
		}
		ds[i].Evidence = ev
	}
}

func cursorToPB(c *Cursor) *pb.Cursor {
	if c == nil {
		return nil
	}
	return &pb.Cursor{At: tsToPB(c.At), RunId: c.RunID, TaskId: c.TaskID}
}

func cursorFromPB(c *pb.Cursor) *Cursor {
	if c == nil {
		return nil
	}
	return &Cursor{At: tsFromPB(c.At), RunID: c.RunId, TaskID: c.TaskId}
}

func candidateQueryToPB(q CandidateQuery) *pb.CandidateQuery {
	return &pb.CandidateQuery{
		States: q.States, Executors: q.Executors, OrderBy: string(q.OrderBy),
		OlderThan: tsToPB(q.OlderThan), Heartbeat: string(q.Heartbeat),
		After: cursorToPB(q.After), Limit: int32(q.Limit),
	}
}

func candidateQueryFromPB(q *pb.CandidateQuery) CandidateQuery {
	return CandidateQuery{
		States: q.States, Executors: q.Executors, OrderBy: TimeField(q.OrderBy),
		OlderThan: tsFromPB(q.OlderThan), Heartbeat: HeartbeatFilter(q.Heartbeat),
		After: cursorFromPB(q.After), Limit: int(q.Limit),
	}
}

func candidatePageToPB(p CandidatePage) *pb.CandidatePage {
	out := &pb.CandidatePage{Next: cursorToPB(p.Next), Candidates: make([]*pb.Candidate, len(p.Candidates))}
	for i, c := range p.Candidates {
		out.Candidates[i] = &pb.Candidate{
			Attempt: attemptToPB(c.Attempt), State: c.State, Executor: c.Executor,
			QueuedAt: tsToPB(c.QueuedAt), RunningAt: tsToPB(c.RunningAt),
			LastHeartbeatAt: tsToPB(c.LastHeartbeatAt), ReleasedAt: tsToPB(c.ReleasedAt),
			InfraMarkedAt: tsToPB(c.InfraMarkedAt), InfraConfirmedAt: tsToPB(c.InfraConfirmedAt),
			LastFailureKind: c.LastFailureKind, WarmWorker: c.WarmWorker,
			ExecutionTimeout: durToPB(c.ExecutionTimeout),
		}
	}
	return out
}

func candidatePageFromPB(p *pb.CandidatePage) CandidatePage {
	out := CandidatePage{Next: cursorFromPB(p.Next), Candidates: make([]Candidate, len(p.Candidates))}
	for i, c := range p.Candidates {
		out.Candidates[i] = Candidate{
			Attempt: attemptFromPB(c.Attempt), State: c.State, Executor: c.Executor,
			QueuedAt: tsFromPB(c.QueuedAt), RunningAt: tsFromPB(c.RunningAt),
			LastHeartbeatAt: tsFromPB(c.LastHeartbeatAt), ReleasedAt: tsFromPB(c.ReleasedAt),
			InfraMarkedAt: tsFromPB(c.InfraMarkedAt), InfraConfirmedAt: tsFromPB(c.InfraConfirmedAt),
			LastFailureKind: c.LastFailureKind, WarmWorker: c.WarmWorker,
			ExecutionTimeout: durFromPB(c.ExecutionTimeout),
		}
	}
	return out
}

func marksToPB(ms []Mark) []*pb.Mark {
	out := make([]*pb.Mark, len(ms))
	for i, m := range ms {
		out[i] = &pb.Mark{
			Attempt: attemptToPB(m.Attempt), FromStates: m.FromStates,
			HeartbeatBefore: tsToPB(m.HeartbeatBefore), RequireNoHeartbeat: m.RequireNoHeartbeat,
			Kind: string(m.Kind), Reason: m.Reason, Message: m.Message,
			Confirm: m.Confirm, Hold: m.Hold, Term: m.Term, At: tsToPB(m.At),
		}
	}
	return out
}

func marksFromPB(ms []*pb.Mark) []Mark {
	out := make([]Mark, len(ms))
	for i, m := range ms {
		out[i] = Mark{
			Attempt: attemptFromPB(m.Attempt), FromStates: m.FromStates,
			HeartbeatBefore: tsFromPB(m.HeartbeatBefore), RequireNoHeartbeat: m.RequireNoHeartbeat,
			Kind: MarkKind(m.Kind), Reason: m.Reason, Message: m.Message,
			Confirm: m.Confirm, Hold: m.Hold, Term: m.Term, At: tsFromPB(m.At),
		}
	}
	return out
}

func markResultsToPB(rs []MarkResult) []*pb.MarkResult {
	out := make([]*pb.MarkResult, len(rs))
	for i, r := range rs {
		out[i] = &pb.MarkResult{Attempt: attemptToPB(r.Attempt), Applied: r.Applied, NoopReason: r.NoopReason}
	}
	return out
}

func markResultsFromPB(rs []*pb.MarkResult) []MarkResult {
	out := make([]MarkResult, len(rs))
	for i, r := range rs {
		out[i] = MarkResult{Attempt: attemptFromPB(r.Attempt), Applied: r.Applied, NoopReason: r.NoopReason}
	}
	return out
}

func runCursorToPB(c *RunCursor) *pb.RunCursor {
	if c == nil {
		return nil
	}
	return &pb.RunCursor{At: tsToPB(c.At), RunId: c.RunID}
}

func runCursorFromPB(c *pb.RunCursor) *RunCursor {
	if c == nil {
		return nil
	}
	return &RunCursor{At: tsFromPB(c.At), RunID: c.RunId}
}

func runPageToPB(p RunPage) *pb.RunPage {
	out := &pb.RunPage{Next: runCursorToPB(p.Next), Runs: make([]*pb.RunCandidate, len(p.Runs))}
	for i, r := range p.Runs {
		out.Runs[i] = &pb.RunCandidate{RunId: r.RunID, DagId: r.DagID,
			StartedAt: tsToPB(r.StartedAt), LastActivity: tsToPB(r.LastActivity)}
	}
	return out
}

func runPageFromPB(p *pb.RunPage) RunPage {
	out := RunPage{Next: runCursorFromPB(p.Next), Runs: make([]RunCandidate, len(p.Runs))}
	for i, r := range p.Runs {
		out.Runs[i] = RunCandidate{RunID: r.RunId, DagID: r.DagId,
			StartedAt: tsFromPB(r.StartedAt), LastActivity: tsFromPB(r.LastActivity)}
	}
	return out
}

func logLinesToPB(ls []LogLine) []*pb.LogLine {
	out := make([]*pb.LogLine, len(ls))
	for i, l := range ls {
		out[i] = &pb.LogLine{Attempt: attemptToPB(l.Attempt), At: tsToPB(l.At), Line: l.Line}
	}
	return out
}

func logLinesFromPB(ls []*pb.LogLine) []LogLine {
	out := make([]LogLine, len(ls))
	for i, l := range ls {
		out[i] = LogLine{Attempt: attemptFromPB(l.Attempt), At: tsFromPB(l.At), Line: l.Line}
	}
	return out
}

func livenessToPB(ls []AttemptLiveness) []*pb.AttemptLiveness {
	out := make([]*pb.AttemptLiveness, len(ls))
	for i, l := range ls {
		out[i] = &pb.AttemptLiveness{Attempt: attemptToPB(l.Attempt), State: string(l.State),
			Agent: string(l.Agent), Group: string(l.Group), Orphan: l.Orphan, Pending: l.Pending, Detail: l.Detail}
	}
	return out
}

func livenessFromPB(ls []*pb.AttemptLiveness) []AttemptLiveness {
	out := make([]AttemptLiveness, len(ls))
	for i, l := range ls {
		out[i] = AttemptLiveness{Attempt: attemptFromPB(l.Attempt), State: Liveness(l.State),
			Agent: Liveness(l.Agent), Group: Liveness(l.Group), Orphan: l.Orphan, Pending: l.Pending, Detail: l.Detail}
	}
	return out
}

func teardownOutcomesToPB(os []TeardownOutcome) []*pb.TeardownOutcome {
	out := make([]*pb.TeardownOutcome, len(os))
	for i, o := range os {
		out[i] = &pb.TeardownOutcome{Object: o.Object, Action: o.Action, Error: o.Error}
	}
	return out
}

func teardownOutcomesFromPB(os []*pb.TeardownOutcome) []TeardownOutcome {
	out := make([]TeardownOutcome, len(os))
	for i, o := range os {
		out[i] = TeardownOutcome{Object: o.Object, Action: o.Action, Error: o.Error}
	}
	return out
}
