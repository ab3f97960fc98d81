package plugin

import (
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// The functions below translate between the Go types of this package and
// their protocol messages. A zero time.Time travels as 0.
//
// Text that a task, an agent, a pod or a plugin wrote (reasons, messages,
// log lines, details, evidence, liveness and teardown errors) is made safe
// as it is put on the wire (sdk.SafeText, with the board's bounds): a
// proto3 string must be valid UTF-8, and protobuf refuses to marshal a
// message holding one that is not, so one such string would fail the whole
// call that carries it (a batch of every tenant's marks or settlements).
// The board makes the same text safe again at its edge.

func tsToPB(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tsFromPB(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func durToPB(d time.Duration) int64 { return int64(d) }

func durFromPB(ns int64) time.Duration { return time.Duration(ns) }

func attemptToPB(a sdk.Attempt) *pb.Attempt {
	return &pb.Attempt{RunId: a.RunID, TaskId: a.TaskID, TryNumber: a.Try, AttemptEpoch: a.Epoch}
}

func attemptFromPB(a *pb.Attempt) sdk.Attempt {
	if a == nil {
		return sdk.Attempt{}
	}
	return sdk.Attempt{RunID: a.RunId, TaskID: a.TaskId, Try: a.TryNumber, Epoch: a.AttemptEpoch}
}

func attemptsToPB(as []sdk.Attempt) []*pb.Attempt {
	out := make([]*pb.Attempt, len(as))
	for i, a := range as {
		out[i] = attemptToPB(a)
	}
	return out
}

// podUIDsToPB lays the recorded pod UIDs out at the attempts' positions
// (nil when none is recorded).
func podUIDsToPB(as []sdk.Attempt, uids map[sdk.Attempt]string) []string {
	var out []string
	for i, a := range as {
		if u := uids[a]; u != "" {
			if out == nil {
				out = make([]string, len(as))
			}
			out[i] = u
		}
	}
	return out
}

// podUIDsFromPB reads the recorded pod UIDs by position (nil when none).
func podUIDsFromPB(as []sdk.Attempt, uids []string) map[sdk.Attempt]string {
	var out map[sdk.Attempt]string
	for i, u := range uids {
		if i >= len(as) || u == "" {
			continue
		}
		if out == nil {
			out = map[sdk.Attempt]string{}
		}
		out[as[i]] = u
	}
	return out
}

func attemptsFromPB(as []*pb.Attempt) []sdk.Attempt {
	out := make([]sdk.Attempt, len(as))
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

// decisionsToPB encodes a pass's or a sweep's decisions (see DecisionSet
// in the protocol): each evidence key is sent once, and so are the reaper
// and the evidence entries every decision shares (a pass's decisions repeat
// the term, the edition, the thresholds and the policy).
func decisionsToPB(ds []sdk.Decision) *pb.DecisionSet {
	set := &pb.DecisionSet{Decisions: make([]*pb.Decision, len(ds))}
	if len(ds) == 0 {
		return set
	}
	common := commonEvidence(ds)
	// keys indexes set.Keys; a shared key's entry is the common one.
	type keyInfo struct {
		index  uint32
		shared bool
	}
	keys := make(map[string]keyInfo, 2*len(ds[0].Evidence))
	for k, v := range common {
		keys[k] = keyInfo{index: uint32(len(set.Keys)), shared: true}
		set.CommonKeys = append(set.CommonKeys, uint32(len(set.Keys)))
		set.CommonValues = append(set.CommonValues, sdk.SafeText(v, sdk.MaxEvidenceValueBytes))
		set.Keys = append(set.Keys, sdk.SafeText(k, sdk.MaxEvidenceKeyBytes))
	}
	set.Reaper = sdk.SafeText(ds[0].Reaper, sdk.MaxNameBytes)
	entries := 0
	for _, d := range ds {
		if d.Reaper != set.Reaper {
			set.Reaper = ""
		}
		entries += len(d.Evidence)
	}
	// One allocation each for the messages, their attempts and their
	// evidence entries, which a large pass has by the ten thousand.
	msgs := make([]pb.Decision, len(ds))
	attempts := make([]pb.Attempt, len(ds))
	evKeys := make([]uint32, 0, entries)
	evValues := make([]string, 0, entries)
	for i, d := range ds {
		out := &msgs[i]
		out.Label, out.Applied, out.DryRun = sdk.SafeText(d.Label, sdk.MaxNameBytes), d.Applied, d.DryRun
		out.Detail = sdk.SafeText(d.Detail, sdk.MaxDetailBytes)
		a := d.Attempt
		attempts[i] = pb.Attempt{RunId: a.RunID, TaskId: a.TaskID, TryNumber: a.Try, AttemptEpoch: a.Epoch}
		out.Attempt = &attempts[i]
		if set.Reaper == "" {
			out.Reaper = sdk.SafeText(d.Reaper, sdk.MaxNameBytes)
		}
		first := len(evKeys)
		for k, v := range d.Evidence {
			info, ok := keys[k]
			if !ok {
				info = keyInfo{index: uint32(len(set.Keys))}
				keys[k] = info
				set.Keys = append(set.Keys, sdk.SafeText(k, sdk.MaxEvidenceKeyBytes))
			}
			if !info.shared {
				evKeys = append(evKeys, info.index)
				evValues = append(evValues, sdk.SafeText(v, sdk.MaxEvidenceValueBytes))
			}
		}
		if n := len(evKeys); n > first {
			out.EvidenceKeys = evKeys[first:n:n]
			out.EvidenceValues = evValues[first:n:n]
		}
		set.Decisions[i] = out
	}
	return set
}

// commonEvidence is the evidence entries (same key, same value) that every
// decision of ds carries, when there are two decisions or more.
func commonEvidence(ds []sdk.Decision) map[string]string {
	if len(ds) < 2 || len(ds[0].Evidence) == 0 {
		return nil
	}
	common := make(map[string]string, len(ds[0].Evidence))
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
	return common
}

// decisionsFromPB decodes a DecisionSet. An evidence key out of range is
// dropped rather than trusted.
func decisionsFromPB(set *pb.DecisionSet) []sdk.Decision {
	if set == nil {
		return nil
	}
	keys := set.Keys
	keyAt := func(i uint32) (string, bool) {
		if int(i) >= len(keys) {
			return "", false
		}
		return keys[i], true
	}
	n := min(len(set.CommonKeys), len(set.CommonValues))
	out := make([]sdk.Decision, len(set.Decisions))
	for i, d := range set.Decisions {
		m := min(len(d.EvidenceKeys), len(d.EvidenceValues))
		out[i] = sdk.Decision{Reaper: d.Reaper, Label: d.Label, Attempt: attemptFromPB(d.Attempt),
			Applied: d.Applied, DryRun: d.DryRun, Detail: d.Detail}
		if out[i].Reaper == "" {
			out[i].Reaper = set.Reaper
		}
		if n+m == 0 {
			continue
		}
		ev := make(map[string]string, n+m)
		for j := range n {
			if k, ok := keyAt(set.CommonKeys[j]); ok {
				ev[k] = set.CommonValues[j]
			}
		}
		for j := range m {
			if k, ok := keyAt(d.EvidenceKeys[j]); ok {
				ev[k] = d.EvidenceValues[j]
			}
		}
		out[i].Evidence = ev
	}
	return out
}

func cursorToPB(c *sdk.Cursor) *pb.Cursor {
	if c == nil {
		return nil
	}
	return &pb.Cursor{At: tsToPB(c.At), RunId: c.RunID, TaskId: c.TaskID}
}

func cursorFromPB(c *pb.Cursor) *sdk.Cursor {
	if c == nil {
		return nil
	}
	return &sdk.Cursor{At: tsFromPB(c.At), RunID: c.RunId, TaskID: c.TaskId}
}

func candidateQueryToPB(q sdk.CandidateQuery) *pb.CandidateQuery {
	return &pb.CandidateQuery{
		States: q.States, Executors: q.Executors, OrderBy: string(q.OrderBy),
		OlderThan: tsToPB(q.OlderThan), Heartbeat: string(q.Heartbeat),
		After: cursorToPB(q.After), Limit: int32(q.Limit), Only: attemptsToPB(q.Only),
	}
}

func candidateQueryFromPB(q *pb.CandidateQuery) sdk.CandidateQuery {
	return sdk.CandidateQuery{
		States: q.States, Executors: q.Executors, OrderBy: sdk.TimeField(q.OrderBy),
		OlderThan: tsFromPB(q.OlderThan), Heartbeat: sdk.HeartbeatFilter(q.Heartbeat),
		After: cursorFromPB(q.After), Limit: int(q.Limit), Only: attemptsFromPB(q.Only),
	}
}

func candidatePageToPB(p sdk.CandidatePage) *pb.CandidatePage {
	out := &pb.CandidatePage{Next: cursorToPB(p.Next), Candidates: make([]*pb.Candidate, len(p.Candidates))}
	for i, c := range p.Candidates {
		out.Candidates[i] = &pb.Candidate{
			Attempt: attemptToPB(c.Attempt), State: c.State, Executor: c.Executor,
			QueuedAt: tsToPB(c.QueuedAt), RunningAt: tsToPB(c.RunningAt),
			LastHeartbeatAt: tsToPB(c.LastHeartbeatAt), ReleasedAt: tsToPB(c.ReleasedAt),
			InfraMarkedAt: tsToPB(c.InfraMarkedAt), InfraConfirmedAt: tsToPB(c.InfraConfirmedAt),
			LastFailureKind: c.LastFailureKind, WarmWorker: c.WarmWorker,
			ExecutionTimeout: durToPB(c.ExecutionTimeout),
			EndedAt:          tsToPB(c.EndedAt), FailureReason: c.FailureReason,
			CredentialMintedAt: tsToPB(c.CredentialMintedAt),
			PodUid:             c.PodUID,
			WarmClaimedAt:      tsToPB(c.WarmClaimedAt), WarmClaimHolds: c.WarmClaimHolds,
		}
	}
	return out
}

func candidatePageFromPB(p *pb.CandidatePage) sdk.CandidatePage {
	out := sdk.CandidatePage{Next: cursorFromPB(p.Next), Candidates: make([]sdk.Candidate, len(p.Candidates))}
	for i, c := range p.Candidates {
		out.Candidates[i] = sdk.Candidate{
			Attempt: attemptFromPB(c.Attempt), State: c.State, Executor: c.Executor,
			QueuedAt: tsFromPB(c.QueuedAt), RunningAt: tsFromPB(c.RunningAt),
			LastHeartbeatAt: tsFromPB(c.LastHeartbeatAt), ReleasedAt: tsFromPB(c.ReleasedAt),
			InfraMarkedAt: tsFromPB(c.InfraMarkedAt), InfraConfirmedAt: tsFromPB(c.InfraConfirmedAt),
			LastFailureKind: c.LastFailureKind, WarmWorker: c.WarmWorker,
			ExecutionTimeout: durFromPB(c.ExecutionTimeout),
			EndedAt:          tsFromPB(c.EndedAt), FailureReason: c.FailureReason,
			CredentialMintedAt: tsFromPB(c.CredentialMintedAt),
			PodUID:             c.PodUid,
			WarmClaimedAt:      tsFromPB(c.WarmClaimedAt), WarmClaimHolds: c.WarmClaimHolds,
		}
	}
	return out
}

func marksToPB(ms []sdk.Mark) []*pb.Mark {
	out := make([]*pb.Mark, len(ms))
	for i, m := range ms {
		out[i] = &pb.Mark{
			Attempt: attemptToPB(m.Attempt), FromStates: m.FromStates,
			HeartbeatBefore: tsToPB(m.HeartbeatBefore), RequireNoHeartbeat: m.RequireNoHeartbeat,
			Kind: string(m.Kind), Reason: sdk.SafeText(m.Reason, sdk.MaxReasonBytes),
			Message: sdk.SafeText(m.Message, sdk.MaxMessageBytes),
			Confirm: m.Confirm, Hold: m.Hold, Term: m.Term, At: tsToPB(m.At),
		}
	}
	return out
}

func marksFromPB(ms []*pb.Mark) []sdk.Mark {
	out := make([]sdk.Mark, len(ms))
	for i, m := range ms {
		out[i] = sdk.Mark{
			Attempt: attemptFromPB(m.Attempt), FromStates: m.FromStates,
			HeartbeatBefore: tsFromPB(m.HeartbeatBefore), RequireNoHeartbeat: m.RequireNoHeartbeat,
			Kind: sdk.MarkKind(m.Kind), Reason: m.Reason, Message: m.Message,
			Confirm: m.Confirm, Hold: m.Hold, Term: m.Term, At: tsFromPB(m.At),
		}
	}
	return out
}

// markResultsToPB leaves out the attempt of a result that answers the
// request at its position (asked), as most do; markResultsFromPB puts it
// back.
func markResultsToPB(rs []sdk.MarkResult, asked []sdk.Attempt) []*pb.MarkResult {
	out := make([]*pb.MarkResult, len(rs))
	for i, r := range rs {
		out[i] = &pb.MarkResult{Applied: r.Applied, NoopReason: r.NoopReason, RescheduleRefused: r.RescheduleRefused}
		if i >= len(asked) || asked[i] != r.Attempt {
			out[i].Attempt = attemptToPB(r.Attempt)
		}
	}
	return out
}

func markResultsFromPB(rs []*pb.MarkResult, asked []sdk.Attempt) []sdk.MarkResult {
	out := make([]sdk.MarkResult, len(rs))
	for i, r := range rs {
		out[i] = sdk.MarkResult{Applied: r.Applied, NoopReason: r.NoopReason, RescheduleRefused: r.RescheduleRefused}
		switch {
		case r.Attempt != nil:
			out[i].Attempt = attemptFromPB(r.Attempt)
		case i < len(asked):
			out[i].Attempt = asked[i]
		}
	}
	return out
}

// attemptsOf returns the attempts a batch of requests names, in order.
func attemptsOf[T any](reqs []T, attempt func(T) sdk.Attempt) []sdk.Attempt {
	out := make([]sdk.Attempt, len(reqs))
	for i, r := range reqs {
		out[i] = attempt(r)
	}
	return out
}

func markAttempt(m sdk.Mark) sdk.Attempt             { return m.Attempt }
func confirmAttempt(c sdk.Confirm) sdk.Attempt       { return c.Attempt }
func overrideAttempt(o sdk.Override) sdk.Attempt     { return o.Attempt }
func settlementAttempt(s sdk.Settlement) sdk.Attempt { return s.Attempt }
func sightingAttempt(s sdk.PodSighting) sdk.Attempt  { return s.Attempt }

func provisionalQueryToPB(q sdk.ProvisionalQuery) *pb.ProvisionalQuery {
	return &pb.ProvisionalQuery{Executors: q.Executors, After: cursorToPB(q.After), Limit: int32(q.Limit)}
}

func provisionalQueryFromPB(q *pb.ProvisionalQuery) sdk.ProvisionalQuery {
	return sdk.ProvisionalQuery{Executors: q.Executors, After: cursorFromPB(q.After), Limit: int(q.Limit)}
}

func confirmsToPB(cs []sdk.Confirm) []*pb.Confirm {
	out := make([]*pb.Confirm, len(cs))
	for i, c := range cs {
		out[i] = &pb.Confirm{Attempt: attemptToPB(c.Attempt), Term: c.Term, At: tsToPB(c.At)}
	}
	return out
}

func confirmsFromPB(cs []*pb.Confirm) []sdk.Confirm {
	out := make([]sdk.Confirm, len(cs))
	for i, c := range cs {
		out[i] = sdk.Confirm{Attempt: attemptFromPB(c.Attempt), Term: c.Term, At: tsFromPB(c.At)}
	}
	return out
}

func overridesToPB(os []sdk.Override) []*pb.Override {
	out := make([]*pb.Override, len(os))
	for i, o := range os {
		out[i] = &pb.Override{Attempt: attemptToPB(o.Attempt), MarkedAfter: tsToPB(o.MarkedAfter), Term: o.Term, At: tsToPB(o.At),
			EndedAt: tsToPB(o.EndedAt), PodUid: o.PodUID, LossyPod: o.LossyPod}
	}
	return out
}

func overridesFromPB(os []*pb.Override) []sdk.Override {
	out := make([]sdk.Override, len(os))
	for i, o := range os {
		out[i] = sdk.Override{Attempt: attemptFromPB(o.Attempt), MarkedAfter: tsFromPB(o.MarkedAfter), Term: o.Term, At: tsFromPB(o.At),
			EndedAt: tsFromPB(o.EndedAt), PodUID: o.PodUid, LossyPod: o.LossyPod}
	}
	return out
}

func settlementsToPB(ss []sdk.Settlement) []*pb.Settlement {
	out := make([]*pb.Settlement, len(ss))
	for i, s := range ss {
		out[i] = &pb.Settlement{Attempt: attemptToPB(s.Attempt), Outcome: string(s.Outcome), FromStates: s.FromStates,
			Reason: sdk.SafeText(s.Reason, sdk.MaxReasonBytes), Message: sdk.SafeText(s.Message, sdk.MaxMessageBytes),
			Term: s.Term, At: tsToPB(s.At), EndedAt: tsToPB(s.EndedAt),
			PodUid: s.PodUID, LossyPod: s.LossyPod}
	}
	return out
}

func settlementsFromPB(ss []*pb.Settlement) []sdk.Settlement {
	out := make([]sdk.Settlement, len(ss))
	for i, s := range ss {
		out[i] = sdk.Settlement{Attempt: attemptFromPB(s.Attempt), Outcome: sdk.Outcome(s.Outcome), FromStates: s.FromStates,
			Reason: s.Reason, Message: s.Message, Term: s.Term, At: tsFromPB(s.At), EndedAt: tsFromPB(s.EndedAt),
			PodUID: s.PodUid, LossyPod: s.LossyPod}
	}
	return out
}

func sightingsToPB(ss []sdk.PodSighting) []*pb.PodSighting {
	out := make([]*pb.PodSighting, len(ss))
	for i, s := range ss {
		out[i] = &pb.PodSighting{Attempt: attemptToPB(s.Attempt), PodUid: s.PodUID, SeenAt: tsToPB(s.SeenAt),
			MissingAt: tsToPB(s.MissingAt), Term: s.Term, At: tsToPB(s.At)}
	}
	return out
}

func sightingsFromPB(ss []*pb.PodSighting) []sdk.PodSighting {
	out := make([]sdk.PodSighting, len(ss))
	for i, s := range ss {
		out[i] = sdk.PodSighting{Attempt: attemptFromPB(s.Attempt), PodUID: s.PodUid, SeenAt: tsFromPB(s.SeenAt),
			MissingAt: tsFromPB(s.MissingAt), Term: s.Term, At: tsFromPB(s.At)}
	}
	return out
}

func runCursorToPB(c *sdk.RunCursor) *pb.RunCursor {
	if c == nil {
		return nil
	}
	return &pb.RunCursor{At: tsToPB(c.At), RunId: c.RunID}
}

func runCursorFromPB(c *pb.RunCursor) *sdk.RunCursor {
	if c == nil {
		return nil
	}
	return &sdk.RunCursor{At: tsFromPB(c.At), RunID: c.RunId}
}

func runPageToPB(p sdk.RunPage) *pb.RunPage {
	out := &pb.RunPage{Next: runCursorToPB(p.Next), Runs: make([]*pb.RunCandidate, len(p.Runs))}
	for i, r := range p.Runs {
		out.Runs[i] = &pb.RunCandidate{RunId: r.RunID, DagId: r.DagID,
			StartedAt: tsToPB(r.StartedAt), LastActivity: tsToPB(r.LastActivity)}
	}
	return out
}

func runPageFromPB(p *pb.RunPage) sdk.RunPage {
	out := sdk.RunPage{Next: runCursorFromPB(p.Next), Runs: make([]sdk.RunCandidate, len(p.Runs))}
	for i, r := range p.Runs {
		out.Runs[i] = sdk.RunCandidate{RunID: r.RunId, DagID: r.DagId,
			StartedAt: tsFromPB(r.StartedAt), LastActivity: tsFromPB(r.LastActivity)}
	}
	return out
}

func logLinesToPB(ls []sdk.LogLine) []*pb.LogLine {
	out := make([]*pb.LogLine, len(ls))
	for i, l := range ls {
		out[i] = &pb.LogLine{Attempt: attemptToPB(l.Attempt), At: tsToPB(l.At), Line: sdk.SafeText(l.Line, sdk.MaxLogLineBytes)}
	}
	return out
}

func logLinesFromPB(ls []*pb.LogLine) []sdk.LogLine {
	out := make([]sdk.LogLine, len(ls))
	for i, l := range ls {
		out[i] = sdk.LogLine{Attempt: attemptFromPB(l.Attempt), At: tsFromPB(l.At), Line: l.Line}
	}
	return out
}

// livenessToPB leaves out the attempt of an answer about the requested
// attempt at its position; livenessFromPB puts it back.
func livenessToPB(ls []sdk.AttemptLiveness, asked []sdk.Attempt) []*pb.AttemptLiveness {
	out := make([]*pb.AttemptLiveness, len(ls))
	for i, l := range ls {
		out[i] = &pb.AttemptLiveness{State: string(l.State),
			Agent: string(l.Agent), Group: string(l.Group), Orphan: l.Orphan, Pending: l.Pending,
			Detail: sdk.SafeText(l.Detail, sdk.MaxEvidenceValueBytes), Node: sdk.SafeText(l.Node, sdk.MaxNameBytes),
			NodeUnreachableSince: tsToPB(l.NodeUnreachableSince), NodeError: sdk.SafeText(l.NodeError, sdk.MaxEvidenceValueBytes)}
		if i >= len(asked) || asked[i] != l.Attempt {
			out[i].Attempt = attemptToPB(l.Attempt)
		}
	}
	return out
}

func livenessFromPB(ls []*pb.AttemptLiveness, asked []sdk.Attempt) []sdk.AttemptLiveness {
	out := make([]sdk.AttemptLiveness, len(ls))
	for i, l := range ls {
		out[i] = sdk.AttemptLiveness{State: sdk.Liveness(l.State),
			Agent: sdk.Liveness(l.Agent), Group: sdk.Liveness(l.Group), Orphan: l.Orphan, Pending: l.Pending, Detail: l.Detail,
			Node: l.Node, NodeUnreachableSince: tsFromPB(l.NodeUnreachableSince), NodeError: l.NodeError}
		switch {
		case l.Attempt != nil:
			out[i].Attempt = attemptFromPB(l.Attempt)
		case i < len(asked):
			out[i].Attempt = asked[i]
		}
	}
	return out
}

func teardownOutcomesToPB(os []sdk.TeardownOutcome) []*pb.TeardownOutcome {
	out := make([]*pb.TeardownOutcome, len(os))
	for i, o := range os {
		out[i] = &pb.TeardownOutcome{Object: sdk.SafeText(o.Object, sdk.MaxNameBytes), Action: o.Action,
			Error: sdk.SafeText(o.Error, sdk.MaxMessageBytes)}
	}
	return out
}

func teardownOutcomesFromPB(os []*pb.TeardownOutcome) []sdk.TeardownOutcome {
	out := make([]sdk.TeardownOutcome, len(os))
	for i, o := range os {
		out[i] = sdk.TeardownOutcome{Object: o.Object, Action: o.Action, Error: o.Error}
	}
	return out
}

func runQueryToPB(q sdk.RunQuery) *pb.RunQuery {
	return &pb.RunQuery{OlderThan: tsToPB(q.OlderThan), After: runCursorToPB(q.After), Limit: int32(q.Limit),
		ProvisionalAfter: tsToPB(q.ProvisionalAfter)}
}

func runQueryFromPB(q *pb.RunQuery) sdk.RunQuery {
	return sdk.RunQuery{OlderThan: tsFromPB(q.OlderThan), After: runCursorFromPB(q.After), Limit: int(q.Limit),
		ProvisionalAfter: tsFromPB(q.ProvisionalAfter)}
}

func runReapToPB(r sdk.RunReap) *pb.RunReap {
	return &pb.RunReap{RunId: r.RunID, OlderThan: tsToPB(r.OlderThan), Term: r.Term, At: tsToPB(r.At),
		Message: sdk.SafeText(r.Message, sdk.MaxMessageBytes), ProvisionalAfter: tsToPB(r.ProvisionalAfter)}
}

func runReapFromPB(r *pb.RunReap) sdk.RunReap {
	return sdk.RunReap{RunID: r.RunId, OlderThan: tsFromPB(r.OlderThan), Term: r.Term, At: tsFromPB(r.At),
		Message: r.Message, ProvisionalAfter: tsFromPB(r.ProvisionalAfter)}
}
