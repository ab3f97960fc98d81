package plugin

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// wire sends m through the protobuf encoding and back, as a call does.
func wire[M proto.Message](t *testing.T, m M, into M) M {
	t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(data, into); err != nil {
		t.Fatal(err)
	}
	return into
}

func TestDecisionSetRoundTrips(t *testing.T) {
	in := []sdk.Decision{
		{Reaper: "agentlost", Label: "a", Attempt: sdk.Attempt{RunID: "r1", TaskID: "t", Try: 2}, Applied: true,
			Evidence: map[string]string{"term": "3", "edition": "lite", "age": "1s"}},
		{Reaper: "agentlost", Label: "b", Attempt: sdk.Attempt{RunID: "r2", TaskID: "t", Try: 1}, DryRun: true, Detail: "why",
			Evidence: map[string]string{"term": "3", "edition": "kube", "age": "2s"}},
		{Reaper: "agentlost", Label: "c", Evidence: map[string]string{"term": "3", "age": "3s"}},
		{Reaper: "other", Label: "d"},
	}
	for _, n := range []int{0, 1, 3, 4} {
		out := decisionsFromPB(wire(t, decisionsToPB(in[:n]), &pb.DecisionSet{}))
		if len(out) != n {
			t.Fatalf("n=%d: %d decisions back", n, len(out))
		}
		for i := range out {
			want := in[i]
			if len(want.Evidence) == 0 {
				want.Evidence = nil
			}
			if !reflect.DeepEqual(out[i], want) {
				t.Fatalf("n=%d decision %d: got %+v, want %+v", n, i, out[i], want)
			}
		}
	}
	set := decisionsToPB(in[:3])
	if len(set.CommonKeys) != 1 || set.Keys[set.CommonKeys[0]] != "term" || len(set.Decisions[0].EvidenceKeys) != 2 {
		t.Fatalf("shared entries not sent once: %v", set)
	}
	if set.Reaper != "agentlost" || set.Decisions[0].Reaper != "" {
		t.Fatalf("shared reaper not sent once: %v", set)
	}
	if got := decisionsToPB(in).Reaper; got != "" {
		t.Fatalf("reapers differ, yet the set names %q", got)
	}
}

func TestDecisionSetDropsKeysOutOfRange(t *testing.T) {
	set := &pb.DecisionSet{Keys: []string{"age"}, Decisions: []*pb.Decision{
		{Label: "x", EvidenceKeys: []uint32{0, 7}, EvidenceValues: []string{"1s", "lost"}},
	}}
	out := decisionsFromPB(set)
	if !reflect.DeepEqual(out[0].Evidence, map[string]string{"age": "1s"}) {
		t.Fatalf("evidence %v", out[0].Evidence)
	}
}

func TestResultsAnswerByPosition(t *testing.T) {
	a, b, c := sdk.Attempt{RunID: "r", TaskID: "a", Try: 1}, sdk.Attempt{RunID: "r", TaskID: "b", Try: 1}, sdk.Attempt{RunID: "r", TaskID: "c", Try: 2}
	marks := []sdk.Mark{{Attempt: a}, {Attempt: b}}
	// The second result is about another attempt than the mark at its
	// position, and the third has no mark: both travel with their attempt.
	results := []sdk.MarkResult{{Attempt: a, Applied: true}, {Attempt: c, NoopReason: "state"}, {Attempt: b}}
	enc := markResultsToPB(results, attemptsOf(marks, markAttempt))
	if enc[0].Attempt != nil || enc[1].Attempt == nil || enc[2].Attempt == nil {
		t.Fatalf("attempts sent: %v", enc)
	}
	back := wire(t, &pb.MarkResponse{Results: enc}, &pb.MarkResponse{})
	if got := markResultsFromPB(back.Results, attemptsOf(marks, markAttempt)); !reflect.DeepEqual(got, results) {
		t.Fatalf("mark results %+v, want %+v", got, results)
	}

	asked := []sdk.Attempt{a, b}
	answers := []sdk.AttemptLiveness{{Attempt: a, State: sdk.Dead}, {Attempt: c, State: sdk.Alive}}
	lenc := livenessToPB(answers, asked)
	if lenc[0].Attempt != nil || lenc[1].Attempt == nil {
		t.Fatalf("attempts sent: %v", lenc)
	}
	lback := wire(t, &pb.LivenessResponse{Results: lenc}, &pb.LivenessResponse{})
	if got := livenessFromPB(lback.Results, asked); !reflect.DeepEqual(got, answers) {
		t.Fatalf("liveness %+v, want %+v", got, answers)
	}
}

// The node fields of a liveness answer (kube's unreachable node) travel
// whole, the zero time as none.
func TestLivenessNodeFieldsRoundTrip(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 2}
	since := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	answers := []sdk.AttemptLiveness{
		{Attempt: a, State: sdk.Alive, Agent: sdk.Alive, Detail: "pod p Running", Node: "node-7", NodeUnreachableSince: since},
		{Attempt: a, State: sdk.Alive, Agent: sdk.Alive, NodeError: "reading node node-7: forbidden"},
		{Attempt: a, State: sdk.Alive, Agent: sdk.Alive},
	}
	asked := []sdk.Attempt{a, a, a}
	back := wire(t, &pb.LivenessResponse{Results: livenessToPB(answers, asked)}, &pb.LivenessResponse{})
	if got := livenessFromPB(back.Results, asked); !reflect.DeepEqual(got, answers) {
		t.Fatalf("liveness %+v, want %+v", got, answers)
	}
}

func TestTimesRoundTrip(t *testing.T) {
	for _, in := range []time.Time{{}, time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC),
		time.Date(2030, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))} {
		got := tsFromPB(tsToPB(in))
		if !got.Equal(in) || got.IsZero() != in.IsZero() || (!got.IsZero() && got.Location() != time.UTC) {
			t.Fatalf("%v came back as %v", in, got)
		}
	}
	if tsToPB(time.Time{}) != 0 {
		t.Fatal("the zero time must travel as 0 (none)")
	}
}

func TestReconcilerRequestsRoundTrip(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 2, Epoch: 3}
	cs := []sdk.Confirm{{Attempt: a, Term: 4, At: at}}
	if got := confirmsFromPB(wire(t, &pb.ConfirmRequest{Confirms: confirmsToPB(cs)}, &pb.ConfirmRequest{}).Confirms); !reflect.DeepEqual(got, cs) {
		t.Fatalf("confirms %+v, want %+v", got, cs)
	}
	os := []sdk.Override{{Attempt: a, MarkedAfter: at.Add(-time.Minute), Term: 4, At: at}}
	if got := overridesFromPB(wire(t, &pb.OverrideRequest{Overrides: overridesToPB(os)}, &pb.OverrideRequest{}).Overrides); !reflect.DeepEqual(got, os) {
		t.Fatalf("overrides %+v, want %+v", got, os)
	}
	ss := []sdk.Settlement{{Attempt: a, Outcome: sdk.OutcomeInfra, FromStates: []string{sdk.StateRunning},
		Reason: sdk.ReasonPodDisrupted, Message: "pod_disrupted: node shutdown", Term: 4, At: at}}
	if got := settlementsFromPB(wire(t, &pb.SettleRequest{Settlements: settlementsToPB(ss)}, &pb.SettleRequest{}).Settlements); !reflect.DeepEqual(got, ss) {
		t.Fatalf("settlements %+v, want %+v", got, ss)
	}
}

// A write read from a pod that names its task only by the lossy label
// carries the pod's UID across the wire, so the host's board resolves (or
// guards) it by the recorded UID, never by the label.
func TestLossyPodWritesRoundTrip(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	a := sdk.Attempt{RunID: "r", TaskID: "load-a", Try: 2, Epoch: 3}
	os := []sdk.Override{{Attempt: a, MarkedAfter: at.Add(-time.Minute), EndedAt: at.Add(-time.Second), PodUID: "uid-1",
		LossyPod: true, Term: 4, At: at}}
	if got := overridesFromPB(wire(t, &pb.OverrideRequest{Overrides: overridesToPB(os)}, &pb.OverrideRequest{}).Overrides); !reflect.DeepEqual(got, os) {
		t.Fatalf("overrides %+v, want %+v", got, os)
	}
	ss := []sdk.Settlement{{Attempt: a, Outcome: sdk.OutcomeSuccess, FromStates: []string{sdk.StateQueued, sdk.StateRunning},
		EndedAt: at.Add(-time.Second), PodUID: "uid-1", LossyPod: true, Term: 4, At: at}}
	if got := settlementsFromPB(wire(t, &pb.SettleRequest{Settlements: settlementsToPB(ss)}, &pb.SettleRequest{}).Settlements); !reflect.DeepEqual(got, ss) {
		t.Fatalf("settlements %+v, want %+v", got, ss)
	}
	q := sdk.ProvisionalQuery{Executors: []string{sdk.ExecutorKube}, After: &sdk.Cursor{At: at, RunID: "r", TaskID: "t"}, Limit: 7}
	if got := provisionalQueryFromPB(wire(t, provisionalQueryToPB(q), &pb.ProvisionalQuery{})); !reflect.DeepEqual(got, q) {
		t.Fatalf("query %+v, want %+v", got, q)
	}
	page := sdk.CandidatePage{Candidates: []sdk.Candidate{{Attempt: a, State: sdk.StateFailed, EndedAt: at,
		InfraMarkedAt: at, LastFailureKind: sdk.FailureInfra, FailureReason: sdk.LabelAgentLost}}}
	if got := candidatePageFromPB(wire(t, candidatePageToPB(page), &pb.CandidatePage{})); !reflect.DeepEqual(got, page) {
		t.Fatalf("page %+v, want %+v", got, page)
	}
	// A warm mark carries its worker's last claim (a v1 addition).
	warm := sdk.CandidatePage{Candidates: []sdk.Candidate{{Attempt: a, State: sdk.StateFailed, Executor: sdk.ExecutorWarm,
		InfraMarkedAt: at, WarmWorker: "w-1", WarmClaimedAt: at.Add(time.Second), WarmClaimHolds: true}}}
	if got := candidatePageFromPB(wire(t, candidatePageToPB(warm), &pb.CandidatePage{})); !reflect.DeepEqual(got, warm) {
		t.Fatalf("warm page %+v, want %+v", got, warm)
	}
}

// The pod UID recorded on an attempt crosses the wire on the candidate, the
// liveness request (at the attempt's position) and the teardown request, so
// that the substrate takes only that pod for the attempt's.
func TestRecordedPodUIDRoundTrips(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 2, Epoch: 3}
	b := sdk.Attempt{RunID: "r", TaskID: "u", Try: 1, Epoch: 1}
	page := sdk.CandidatePage{Candidates: []sdk.Candidate{{Attempt: a, State: sdk.StateRunning, PodUID: "uid-a"}}}
	if got := candidatePageFromPB(wire(t, candidatePageToPB(page), &pb.CandidatePage{})); !reflect.DeepEqual(got, page) {
		t.Fatalf("page %+v, want %+v", got, page)
	}
	as := []sdk.Attempt{b, a}
	uids := map[sdk.Attempt]string{a: "uid-a"}
	in := wire(t, &pb.LivenessRequest{Attempts: attemptsToPB(as), PodUids: podUIDsToPB(as, uids)}, &pb.LivenessRequest{})
	if got := podUIDsFromPB(attemptsFromPB(in.Attempts), in.PodUids); !reflect.DeepEqual(got, uids) {
		t.Fatalf("pod uids %+v, want %+v", got, uids)
	}
	if got := podUIDsToPB(as, nil); got != nil {
		t.Fatalf("no recorded UID sent %q, want none", got)
	}
	td := wire(t, &pb.TeardownRequest{Attempt: attemptToPB(a), PodUid: "uid-a"}, &pb.TeardownRequest{})
	if td.PodUid != "uid-a" {
		t.Fatalf("teardown pod uid %q", td.PodUid)
	}
}

// A settlement's refused reschedule travels back to the plugin with its
// result (field 4 of MarkResult).
func TestResultsCarryARefusedReschedule(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "a", Try: 1, Epoch: 3}
	results := []sdk.MarkResult{{Attempt: a, Applied: true, RescheduleRefused: sdk.LabelRescheduleNotSensor}}
	back := wire(t, &pb.MarkResponse{Results: markResultsToPB(results, []sdk.Attempt{a})}, &pb.MarkResponse{})
	if got := markResultsFromPB(back.Results, []sdk.Attempt{a}); !reflect.DeepEqual(got, results) {
		t.Fatalf("mark results %+v, want %+v", got, results)
	}
}

// TestTenantsTextCrossesTheWireMadeSafe: a proto3 string must be valid
// UTF-8, and protobuf refuses to marshal a message holding one that is not;
// a plugin's batch carrying one tenant's invalid text (a mark's reason, a
// settlement's message, a log line, a decision's detail or evidence, a
// liveness detail, a teardown error, a run reap's message) would fail
// whole. Each is made safe as it is put on the wire (sdk.SafeText), NULs
// too, and the call goes through.
func TestTenantsTextCrossesTheWireMadeSafe(t *testing.T) {
	const bad, safe = "bad\xff\x00byte", "bad\uFFFD\uFFFDbyte"
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	marks := marksFromPB(wire(t, &pb.MarkRequest{Marks: marksToPB([]sdk.Mark{{Attempt: a, Reason: bad, Message: bad}})},
		&pb.MarkRequest{}).Marks)
	if marks[0].Reason != safe || marks[0].Message != safe {
		t.Fatalf("mark %+v", marks[0])
	}
	ss := settlementsFromPB(wire(t, &pb.SettleRequest{Settlements: settlementsToPB([]sdk.Settlement{{Attempt: a,
		Reason: bad, Message: bad}})}, &pb.SettleRequest{}).Settlements)
	if ss[0].Reason != safe || ss[0].Message != safe {
		t.Fatalf("settlement %+v", ss[0])
	}
	lines := logLinesFromPB(wire(t, &pb.AppendLogRequest{Lines: logLinesToPB([]sdk.LogLine{{Attempt: a, Line: bad}})},
		&pb.AppendLogRequest{}).Lines)
	if lines[0].Line != safe {
		t.Fatalf("log line %q", lines[0].Line)
	}
	ds := decisionsFromPB(wire(t, decisionsToPB([]sdk.Decision{
		{Reaper: "x", Label: "l", Detail: bad, Evidence: map[string]string{"k": bad, bad: "v"}},
		{Reaper: "x", Label: "l", Detail: "ok", Evidence: map[string]string{"k": bad}},
	}), &pb.DecisionSet{}))
	if ds[0].Detail != safe || ds[0].Evidence["k"] != safe || ds[0].Evidence[safe] != "v" || ds[1].Evidence["k"] != safe {
		t.Fatalf("decisions %+v", ds)
	}
	live := livenessFromPB(wire(t, &pb.LivenessResponse{Results: livenessToPB([]sdk.AttemptLiveness{{Attempt: a,
		Detail: bad, NodeError: bad}}, nil)}, &pb.LivenessResponse{}).Results, nil)
	if live[0].Detail != safe || live[0].NodeError != safe {
		t.Fatalf("liveness %+v", live[0])
	}
	outs := teardownOutcomesFromPB(wire(t, &pb.TeardownResponse{Outcomes: teardownOutcomesToPB([]sdk.TeardownOutcome{{Error: bad}})},
		&pb.TeardownResponse{}).Outcomes)
	if outs[0].Error != safe {
		t.Fatalf("teardown outcome %+v", outs[0])
	}
	if r := runReapFromPB(wire(t, runReapToPB(sdk.RunReap{RunID: "r", Message: bad}), &pb.RunReap{})); r.Message != safe {
		t.Fatalf("run reap %+v", r)
	}
}
