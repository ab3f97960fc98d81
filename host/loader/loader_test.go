package loader_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk/plugin"
	"github.com/dexaflow/reaper/testkit/eventually"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// pluginDir holds the real plugin binaries built once for this package.
var pluginDir string

func TestMain(m *testing.M) {
	if os.Getenv(hostModeEnv) != "" {
		os.Exit(hostMain())
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "reaper-loader-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginDir = dir
	build := func(pkg, out string) error {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		cmd.Stderr = os.Stderr
		return cmd.Run()
	}
	if err := build("./testdata/testreaper", "reaper-echo"); err != nil {
		fmt.Fprintln(os.Stderr, "build test plugin:", err)
		return 1
	}
	if err := build("./testdata/testsubstrate", "reaper-substrate-reconcile"); err != nil {
		fmt.Fprintln(os.Stderr, "build test substrate:", err)
		return 1
	}
	if err := build("../../substrate/kube/cmd/reaper-substrate-kube", "reaper-substrate-kube"); err != nil {
		fmt.Fprintln(os.Stderr, "build kube substrate:", err)
		return 1
	}
	for _, name := range []string{"reaper-crash", "reaper-hang", "reaper-report", "reaper-v99", "reaper-substrate-impostor"} {
		if err := os.Link(filepath.Join(dir, "reaper-echo"), filepath.Join(dir, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "reaper-noexec"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(dir, "reaper-chatty"), []byte("#!/bin/sh\necho hello, I am not a plugin\n"), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func launch(t *testing.T, spec loader.Spec, env ...string) (*loader.Plugin, error) {
	t.Helper()
	ld := &loader.Loader{Dir: pluginDir, Logger: hclog.NewNullLogger(), Env: env}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := ld.Launch(ctx, spec)
	if err == nil {
		t.Cleanup(p.Kill)
	}
	return p, err
}

// recordingBoard is a Board that records what the plugin asked through the
// broker and answers from a fixed set of candidates.
type recordingBoard struct {
	mu         sync.Mutex
	candidates []sdk.Candidate
	queries    []sdk.CandidateQuery
	marks      []sdk.Mark
}

func (b *recordingBoard) ListCandidates(_ context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queries = append(b.queries, q)
	return sdk.CandidatePage{Candidates: b.candidates}, nil
}

func (b *recordingBoard) Mark(_ context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.marks = append(b.marks, marks...)
	out := make([]sdk.MarkResult, len(marks))
	for i, m := range marks {
		out[i] = sdk.MarkResult{Attempt: m.Attempt, Applied: true}
	}
	return out, nil
}

func (b *recordingBoard) ListOrphanRuns(context.Context, sdk.RunQuery) (sdk.RunPage, error) {
	return sdk.RunPage{}, nil
}

func (b *recordingBoard) ReapRun(context.Context, sdk.RunReap) (sdk.RunReapResult, error) {
	return sdk.RunReapResult{}, nil
}

func (b *recordingBoard) AppendLog(context.Context, int64, []sdk.LogLine) error { return nil }

func (b *recordingBoard) ListProvisional(context.Context, sdk.ProvisionalQuery) (sdk.CandidatePage, error) {
	return sdk.CandidatePage{}, nil
}

func (b *recordingBoard) ConfirmInfra(context.Context, []sdk.Confirm) ([]sdk.MarkResult, error) {
	return nil, nil
}

func (b *recordingBoard) OverrideInfra(context.Context, []sdk.Override) ([]sdk.MarkResult, error) {
	return nil, nil
}

func (b *recordingBoard) Settle(context.Context, []sdk.Settlement) ([]sdk.MarkResult, error) {
	return nil, nil
}

func (b *recordingBoard) RecordPodSightings(context.Context, []sdk.PodSighting) ([]sdk.MarkResult, error) {
	return nil, nil
}

// scriptedExec answers liveness from a map.
type scriptedExec struct {
	answers map[sdk.Attempt]sdk.Liveness
}

func (e scriptedExec) Liveness(_ context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	out := make([]sdk.AttemptLiveness, len(req.Attempts))
	for i, a := range req.Attempts {
		st, ok := e.answers[a]
		if !ok {
			st = sdk.Unknown
		}
		out[i] = sdk.AttemptLiveness{Attempt: a, State: st}
	}
	return out, nil
}

func (scriptedExec) Teardown(context.Context, sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return nil, nil
}

func (scriptedExec) StopOrphan(context.Context, sdk.StopRequest) (sdk.StopResult, error) {
	return sdk.StopResult{}, nil
}

func (scriptedExec) WarmWorkers(context.Context) ([]sdk.WarmWorker, error) { return nil, nil }

func configure(t *testing.T, p *loader.Plugin, mode string) {
	t.Helper()
	err := p.Base().Configure(context.Background(), sdk.ConfigureRequest{
		Edition: ladder.EditionLite, Values: sdk.Values{"mode": mode}, Ladder: ladder.Defaults(),
	})
	if err != nil {
		t.Fatalf("configure: %v", err)
	}
}

func TestLaunch(t *testing.T) {
	t.Run("NegotiatesConfiguresAndReapsThroughTheBroker", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		if got := p.ProtocolVersion(); got != plugin.ProtocolVersion {
			t.Fatalf("negotiated version %d, want %d", got, plugin.ProtocolVersion)
		}
		if p.Info.Name != "echo" || p.Info.Kind != sdk.KindReaper {
			t.Fatalf("info = %+v", p.Info)
		}
		schema, err := p.Base().ConfigSchema(context.Background())
		if err != nil {
			t.Fatalf("schema: %v", err)
		}
		if len(schema.Attributes) != 5 || schema.Attributes[1].Default != "90s" {
			t.Fatalf("schema = %+v", schema)
		}
		configure(t, p, "normal")

		now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
		dead := sdk.Attempt{RunID: "r1", TaskID: "t1", Try: 1, Epoch: 2}
		alive := sdk.Attempt{RunID: "r1", TaskID: "t2", Try: 1, Epoch: 0}
		board := &recordingBoard{candidates: []sdk.Candidate{
			{Attempt: dead, State: sdk.StateRunning, LastHeartbeatAt: now.Add(-5 * time.Minute)},
			{Attempt: alive, State: sdk.StateRunning, LastHeartbeatAt: now.Add(-5 * time.Minute)},
		}}
		exec := scriptedExec{answers: map[sdk.Attempt]sdk.Liveness{dead: sdk.Dead, alive: sdk.Alive}}

		for pass := 1; pass <= 2; pass++ {
			var sink sdk.Collector
			res, err := p.Reaper().Reap(context.Background(), sdk.Pass{
				Now: now, Ladder: ladder.Defaults(), Term: 7, State: []byte(strings.Repeat("x", pass-1)),
				Deadline: now.Add(30 * time.Second), Edition: ladder.EditionLite,
			}, board, exec, &sink)
			if err != nil {
				t.Fatalf("pass %d: %v", pass, err)
			}
			if string(res.State) != strings.Repeat("x", pass) {
				t.Fatalf("pass %d: state %q did not round-trip", pass, res.State)
			}
			if len(sink.Decisions()) != 2 {
				t.Fatalf("pass %d: decisions = %+v", pass, sink.Decisions())
			}
			var labels []string
			for _, d := range sink.Decisions() {
				labels = append(labels, d.Label+"@"+d.Attempt.TaskID)
			}
			if got := strings.Join(labels, ","); got != "agent_lost_process_alive@t2,agent_lost@t1" {
				t.Fatalf("pass %d: decisions %s", pass, got)
			}
		}
		board.mu.Lock()
		defer board.mu.Unlock()
		if len(board.queries) != 2 {
			t.Fatalf("board saw %d listings, want 2", len(board.queries))
		}
		q := board.queries[0]
		if !q.OlderThan.Equal(now.Add(-90*time.Second)) || q.OrderBy != sdk.FieldHeartbeatAt {
			t.Fatalf("query = %+v", q)
		}
		if len(board.marks) != 2 || board.marks[0].Attempt != dead || board.marks[0].Term != 7 {
			t.Fatalf("marks = %+v", board.marks)
		}
	})

	t.Run("SubstrateServesTheExecutionsInterface", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindSubstrate, Name: "kube"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		s := p.Substrate()
		if s == nil {
			t.Fatal("not a substrate")
		}
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		live, err := s.Liveness(context.Background(), sdk.LivenessRequest{Attempts: []sdk.Attempt{a}})
		if err != nil || len(live) != 1 || live[0].State != sdk.Unknown || live[0].Attempt != a {
			t.Fatalf("liveness = %+v, %v", live, err)
		}
		// Unconfigured, the kube substrate never reports a sweep complete.
		if _, err := s.Sweep(context.Background(), sdk.SweepRequest{}, &recordingBoard{}); err == nil {
			t.Fatal("an unconfigured kube substrate completed a sweep")
		}
	})

	t.Run("SweepReconcilesThroughTheBrokeredBoard", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindSubstrate, Name: "reconcile"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		now := sdktest.T0()
		board := sdktest.NewBoard()
		board.SetDefaultExecutor(sdk.ExecutorKube)
		provisional := func(task, reason string, markedAt time.Time) sdk.Attempt {
			return board.Put(sdktest.TaskInstance{RunID: "r", TaskID: task, State: sdk.StateFailed,
				LastFailureKind: sdk.FailureInfra, MarkReason: reason, InfraMarkedAt: markedAt, EndedAt: markedAt})
		}
		confirmed := provisional("lost", sdk.LabelPodLost, now.Add(-100*time.Second))
		overridden := provisional("finished", sdk.LabelAgentLost, now.Add(-time.Minute))
		running := board.PutRunning("r", "done", now.Add(-time.Hour), now.Add(-time.Minute))
		board.Update("r", "done", func(t *sdktest.TaskInstance) { t.PodUID = "uid-done" })

		res, err := p.Substrate().Sweep(context.Background(), sdk.SweepRequest{Now: now, Term: board.Term()}, board)
		if err != nil {
			t.Fatalf("sweep: %v", err)
		}
		if len(res.Overrides) != 1 || res.Overrides[sdk.LabelAgentLost] != 1 {
			t.Fatalf("overrides %v, want one over agent_lost", res.Overrides)
		}
		if r := board.Row(confirmed); !r.InfraConfirmedAt.Equal(now) || r.State != sdk.StateFailed {
			t.Fatalf("the confirmed mark: %+v", r)
		}
		if got := board.Log(confirmed); len(got) != 1 || got[0] != "confirmed by the sweep" {
			t.Fatalf("log of the confirmed attempt: %q", got)
		}
		if r := board.Row(overridden); r.State != sdk.StateSuccess || r.LastFailureKind != "" {
			t.Fatalf("the overridden mark: %+v", r)
		}
		if got := board.Log(overridden); len(got) != 1 || got[0] != sdk.OverrideLogLine(sdk.LabelAgentLost) {
			t.Fatalf("log of the overridden attempt: %q", got)
		}
		if r := board.Row(running); r.State != sdk.StateSuccess || !r.EndedAt.Equal(now) {
			t.Fatalf("the settled attempt: %+v", r)
		}
		// The pod sighting went through the brokered board before the
		// settlement.
		if r := board.Row(running); r.PodMissingMax != 30*time.Minute || !r.PodMissingSince.IsZero() {
			t.Fatalf("the pod cache's history of the settled attempt: max %s since %v, want 30m and none",
				r.PodMissingMax, r.PodMissingSince)
		}
	})

	t.Run("ChecksumMatch_Accepted", func(t *testing.T) {
		sum := fileSHA256(t, filepath.Join(pluginDir, "reaper-echo"))
		if _, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo", SHA256: sum}); err != nil {
			t.Fatalf("launch: %v", err)
		}
	})
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestLaunchRefusals(t *testing.T) {
	cases := []struct {
		name string
		spec loader.Spec
		env  []string
		want string
	}{
		{"MissingBinary", loader.Spec{Kind: sdk.KindReaper, Name: "nosuch"}, nil, "binary not found"},
		{"NotExecutable", loader.Spec{Kind: sdk.KindReaper, Name: "noexec"}, nil, "not executable"},
		{"HandshakeFails", loader.Spec{Kind: sdk.KindReaper, Name: "chatty"}, nil, "handshake failed"},
		{"NoCommonProtocolVersion", loader.Spec{Kind: sdk.KindReaper, Name: "v99"}, []string{"TESTREAPER_PROTOCOLS=99"}, "speaks no protocol version"},
		{"ChecksumMismatch", loader.Spec{Kind: sdk.KindReaper, Name: "echo", SHA256: strings.Repeat("ab", 32)}, nil, "checksum mismatch"},
		{"WrongKind", loader.Spec{Kind: sdk.KindSubstrate, Name: "impostor"}, nil, "is a reaper plugin, configured as a substrate"},
		// The labels a plugin may use are fixed at launch, and bounded:
		// never the host's own, never more than the host meters.
		{"DeclaresAHostsLabel", loader.Spec{Kind: sdk.KindReaper, Name: "echo"},
			[]string{"TESTREAPER_DECLARE=" + sdk.LabelReconcileInfraConfirmed}, "a label only the host records"},
		{"DeclaresTooManyLabels", loader.Spec{Kind: sdk.KindReaper, Name: "echo"},
			[]string{"TESTREAPER_DECLARE=100*its_label_"}, "more than 64"},
		{"DeclaresSomethingNoLabelCanBe", loader.Spec{Kind: sdk.KindReaper, Name: "echo"},
			[]string{"TESTREAPER_DECLARE=Not A Label"}, "which is no label"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := launch(t, tc.spec, tc.env...)
			if err == nil {
				t.Fatal("launch succeeded, want a refusal")
			}
			var lerr *loader.Error
			if !errors.As(err, &lerr) || lerr.Name != tc.spec.Name {
				t.Fatalf("error %v does not name plugin %q", err, tc.spec.Name)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.spec.Name)) {
				t.Fatalf("error %q lacks %q or the plugin's name", err, tc.want)
			}
		})
	}
}

func TestPassFailures(t *testing.T) {
	t.Run("CrashMidCall_ErrorNotHang", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "crash"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		configure(t, p, "crash")
		// The guard deadline is far beyond any honest answer; the call must
		// return because the plugin died, not because the guard fired.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err = p.Reaper().Reap(ctx, sdk.Pass{Now: time.Now()}, &recordingBoard{}, scriptedExec{}, &sdk.Collector{})
		if err == nil {
			t.Fatal("reap on a crashed plugin succeeded")
		}
		if ctx.Err() != nil {
			t.Fatalf("the call hung until the guard deadline: %v", err)
		}
		waitExited(t, p)
	})

	t.Run("HangIsBoundedByTheDeadline", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "hang"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		configure(t, p, "hang")
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err = p.Reaper().Reap(ctx, sdk.Pass{Now: time.Now()}, &recordingBoard{}, scriptedExec{}, &sdk.Collector{})
		if err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
			t.Fatalf("err = %v, want a deadline error", err)
		}
	})

	t.Run("BadConfigurationIsRefusedInThePluginsOwnWords", func(t *testing.T) {
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		err = p.Base().Configure(context.Background(), sdk.ConfigureRequest{Values: sdk.Values{"mode": "sideways"}})
		want := `attribute "mode": must be "normal", "crash", "crash_once", "hang", "report", "report_fail", "mark_teardown", "mark_crash", "forge_success", "late_write", "big_reply", "env", "probe", "backdate", "confirm", "foreign_name" or "undeclared_label", not "sideways"`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want exactly the plugin's sentence %q", err, want)
		}
	})
}

// waitExited waits for the crashed process to be reaped by go-plugin.
func waitExited(t *testing.T, p *loader.Plugin) {
	t.Helper()
	if !eventually.Until(10*time.Second, p.Exited) {
		t.Fatal("plugin process still running after its crash")
	}
}

func TestPassDecisionsReportedEarly(t *testing.T) {
	run := func(t *testing.T, mode string) (sdk.PassResult, []sdk.Decision, error) {
		t.Helper()
		p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "report"})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
		configure(t, p, mode)
		var sink sdk.Collector
		res, err := p.Reaper().Reap(context.Background(), sdk.Pass{Now: time.Now(), Term: 9}, &recordingBoard{}, scriptedExec{}, &sink)
		return res, sink.Decisions(), err
	}
	// want checks that the host got the decisions about t0000..t(n-1), in
	// the order the plugin made them, with their evidence.
	want := func(t *testing.T, ds []sdk.Decision, n int) {
		t.Helper()
		if len(ds) != n {
			t.Fatalf("%d decisions, want %d", len(ds), n)
		}
		for i, d := range ds {
			if d.Attempt.TaskID != fmt.Sprintf("t%04d", i) || d.Evidence["n"] != strconv.Itoa(i) || d.Evidence["term"] != "9" {
				t.Fatalf("decision %d is about %s with evidence %v", i, d.Attempt, d.Evidence)
			}
		}
	}

	t.Run("RecordedBatchesArriveInOrder", func(t *testing.T) {
		res, ds, err := run(t, "report")
		if err != nil {
			t.Fatal(err)
		}
		want(t, ds, 2500) // 150, then 2,350 (three messages)
		if string(res.State) != "reported" {
			t.Fatalf("state %q", res.State)
		}
	})

	t.Run("FailedPassStillDeliversItsDecisionsAndState", func(t *testing.T) {
		res, ds, err := run(t, "report_fail")
		if err == nil || !strings.Contains(err.Error(), "failed on purpose") {
			t.Fatalf("err = %v, want the pass's error", err)
		}
		want(t, ds, 155)
		// What the pass owes its next one travels ahead of the error.
		if string(res.State) != "reported" {
			t.Fatalf("a failed pass's state %q did not arrive", res.State)
		}
	})
}
