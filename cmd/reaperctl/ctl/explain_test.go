package ctl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/sdk"
)

// explainBoard holds run r: task t was judged alive once, then marked
// agent_lost and held; task e was marked in epoch 0 and re-placed into
// epoch 1; task u was judged but is not the subject; the run itself was
// judged once by orphanrun.
func explainBoard(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	b := setup(t, "")
	b.createRun(t, "r", base.Add(-time.Hour), "t", "e", "u")
	tt := first("r", "t")
	b.running(t, tt, base.Add(-21*time.Minute), base.Add(-20*time.Minute), base.Add(-10*time.Minute))
	b.decide(t, base.Add(-5*time.Minute), sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLostProcessAlive,
		Attempt: tt, Detail: "heartbeat silent past agent_lost, but the agent process is alive",
		Evidence: map[string]string{"threshold": "1m30s", "liveness": "alive", "heartbeat_age": "5m0s",
			"agent": "alive", "group": "alive", "term": "1", "edition": "lite"}})
	b.mark(t, tt, true, base.Add(-4*time.Minute))
	b.decide(t, base.Add(-4*time.Minute), sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost,
		Attempt: tt, Applied: true, Detail: "agent and task group dead; marked infra, held for review",
		Evidence: map[string]string{"heartbeat_age": "6m0s", "liveness": "dead", "threshold": "1m30s",
			"policy": "hold", "signal": "positive"}})
	if err := b.w.AppendLog(ctx, []sdk.LogLine{{Attempt: tt, At: base.Add(-4 * time.Minute),
		Line: "agent_lost: agent and task group gone"}}); err != nil {
		t.Fatal(err)
	}
	b.decide(t, base.Add(-3*time.Minute),
		sdk.Decision{Reaper: "orphanrun", Label: sdk.LabelOrphanReapNoop, Attempt: sdk.Attempt{RunID: "r"},
			Detail: "the run has a live task instance", Evidence: map[string]string{"noop_reason": sdk.NoopActive}},
		sdk.Decision{Reaper: "dispatchlost", Label: sdk.LabelDispatchLost, Attempt: first("r", "u"), DryRun: true})

	e := first("r", "e")
	b.running(t, e, base.Add(-30*time.Minute), base.Add(-29*time.Minute), base.Add(-28*time.Minute))
	b.mark(t, e, false, base.Add(-20*time.Minute))
	b.decide(t, base.Add(-20*time.Minute), sdk.Decision{Reaper: "agentlost", Label: sdk.LabelAgentLost,
		Attempt: e, Applied: true})
	if rel, err := b.w.Replace(ctx, e, base.Add(-19*time.Minute)); err != nil || !rel.Applied {
		t.Fatalf("re-place: %+v %v", rel, err)
	}
	b.decide(t, base.Add(-2*time.Minute), sdk.Decision{Reaper: "dispatchlost", Label: sdk.LabelDispatchLost,
		Attempt: sdk.Attempt{RunID: "r", TaskID: "e", Try: 1, Epoch: 1}, DryRun: true,
		Detail: "dry-run: would mark dispatch_lost"})
	return b
}

func TestExplain(t *testing.T) {
	t.Parallel()

	t.Run("TellsTheStoryOfAHeldAttempt", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		r := b.ctl(t, "explain", "r", "t").ok(t)
		golden(t, r.stdout, `
r/t is failed, an infra failure (agent_lost), held for review for 4m
  run r (dag dag) is running
  current attempt: try 1 epoch 0 on lite, command sleep 1
  queued 21m ago, running 20m ago, last heartbeat 10m ago, ended 4m ago, infra-marked 4m ago, confirmed 4m ago
  retries left 1 of 1, infra re-places used 0 of 3
  error: agent_lost: no heartbeat for 6m
  no rail re-places it until released: reaperctl release r t

3 decisions, oldest first (1 applied, 1 deferred, 1 no-op):

  2030-01-02T11:55:00Z (5m ago), term 1: agentlost judged try 1 epoch 0
    agent_lost_process_alive: deferred, nothing written
    heartbeat silent past agent_lost, but the agent process is alive
    saw heartbeat_age=5m0s liveness=alive agent=alive group=alive threshold=1m30s edition=lite term=1

  2030-01-02T11:56:00Z (4m ago), term 1: agentlost judged try 1 epoch 0
    agent_lost: applied
    agent and task group dead; marked infra, held for review
    saw heartbeat_age=6m0s liveness=dead threshold=1m30s signal=positive policy=hold
    verdict: not yet, waiting for what the attempt does next

  2030-01-02T11:57:00Z (3m ago), term 1: orphanrun judged the run
    orphan_reap_noop: not applied: active
    the run has a live task instance
    saw noop_reason=active

try log (1 line):
  AT                    TRY  EPOCH  LINE
  2030-01-02T11:56:00Z  1    0      agent_lost: agent and task group gone
`)
	})

	t.Run("MarksDecisionsAboutAnEarlierAttempt", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		r := b.ctl(t, "explain", "r", "e").ok(t)
		golden(t, r.stdout, `
r/e is none
  run r (dag dag) is running
  current attempt: try 1 epoch 1 on lite, command sleep 1
  released 19m ago
  retries left 1 of 1, infra re-places used 1 of 3

3 decisions, oldest first (1 applied, 1 no-op, 1 dry-run):

  2030-01-02T11:40:00Z (20m ago), term 1: agentlost judged try 1 epoch 0 (an earlier attempt)
    agent_lost: applied

  2030-01-02T11:57:00Z (3m ago), term 1: orphanrun judged the run
    orphan_reap_noop: not applied: active
    the run has a live task instance
    saw noop_reason=active

  2030-01-02T11:58:00Z (2m ago), term 1: dispatchlost judged try 1 epoch 1
    dispatch_lost: dry-run, nothing written
    dry-run: would mark dispatch_lost
    verdict: not yet, waiting for what the attempt does next

try log: empty
`)
	})

	t.Run("NoDecisions", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "")
		b.createRun(t, "q", base.Add(-time.Minute), "t")
		r := b.ctl(t, "explain", "q", "t").ok(t)
		golden(t, r.stdout, `
q/t is none
  run q (dag dag) is running
  current attempt: try 1 epoch 0 on lite, command sleep 1
  retries left 1 of 1, infra re-places used 0 of 3

no reaper has judged it (no decisions in the audit)

try log: empty
`)
	})

	t.Run("ShowsTheCredentialMintedRenewedAndStoppedAtTheCeiling", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		b := setup(t, "")
		b.createRun(t, "c", base.Add(-3*time.Hour), "t", "u")
		for _, id := range []string{"t", "u"} {
			a := first("c", id)
			b.queued(t, a, base.Add(-2*time.Hour))
			if ok, err := b.w.RecordMint(ctx, a, base.Add(-2*time.Hour)); err != nil || !ok {
				t.Fatal(ok, err)
			}
			if stop, err := b.w.Running(ctx, a, base.Add(-119*time.Minute)); err != nil || stop {
				t.Fatal(stop, err)
			}
		}
		a := first("c", "t")
		for _, hb := range []struct {
			at time.Duration
			r  lifecycle.Renewal
		}{{-61 * time.Minute, lifecycle.Renewed}, {-60 * time.Minute, lifecycle.Capped}, {-59 * time.Minute, lifecycle.Capped}} {
			if stop, err := b.w.HeartbeatCredential(ctx, a, hb.r, base.Add(hb.at)); err != nil || stop {
				t.Fatal(stop, err)
			}
		}
		out := b.ctl(t, "explain", "c", "t").ok(t).stdout
		want := "  credential minted 2h ago, last renewed 1h1m ago, renewal stopped at the ceiling (auth.max_attempt_credential_lifetime) 1h ago\n"
		if !strings.Contains(out, want) {
			t.Fatalf("explain lacks %q:\n%s", want, out)
		}
		out = b.ctl(t, "explain", "c", "u").ok(t).stdout
		if want := "  credential minted 2h ago, never renewed\n"; !strings.Contains(out, want) {
			t.Fatalf("explain lacks %q:\n%s", want, out)
		}
	})

	t.Run("ShowsAnOwedTeardownAndItsLastError", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		b := explainBoard(t)
		tt := first("r", "t")
		backoff := board.TeardownBackoff{Base: 30 * time.Second, Cap: 5 * time.Minute}
		if _, err := b.store.OweTeardown(ctx, board.TeardownFailure{RunID: "r", Attempt: &tt, Reaper: "agentlost",
			Label: sdk.LabelAgentLostPodDeleteErr, Reason: sdk.LabelAgentLost, At: base.Add(-4 * time.Minute),
			Error: `deleting pod/ns/task-1: pods "task-1" is forbidden`, Term: b.term}, backoff); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.OweTeardown(ctx, board.TeardownFailure{RunID: "r", Attempt: &tt, Reaper: "agentlost",
			Label: sdk.LabelAgentLostPodDeleteErr, Reason: sdk.LabelAgentLost, At: base.Add(-time.Minute),
			Error: "the server has received too many requests", Term: b.term}, backoff); err != nil {
			t.Fatal(err)
		}
		out := b.ctl(t, "explain", "r", "t").ok(t).stdout
		want := `
teardown owed of try 1 epoch 0 since 4m ago (agentlost, reaped as agent_lost): 2 failed tries, due now
  last error (agent_lost_pod_delete_error, 1m ago): the server has received too many requests
`
		if !strings.Contains(out, want[1:]) {
			t.Fatalf("explain lacks %q:\n%s", want, out)
		}
		if out := b.ctl(t, "explain", "r", "u").ok(t).stdout; strings.Contains(out, "teardown owed") {
			t.Fatalf("AnotherTaskShowsNone:\n%s", out)
		}
		var doc explainJSON
		b.ctl(t, "explain", "-json", "r", "t").ok(t).decode(t, &doc)
		if len(doc.OwedTeardowns) != 1 || doc.OwedTeardowns[0].Tries != 2 || doc.OwedTeardowns[0].TaskID != "t" ||
			doc.OwedTeardowns[0].LastError != "the server has received too many requests" {
			t.Fatalf("JSON owed teardowns %+v", doc.OwedTeardowns)
		}
	})

	t.Run("JSONDocument", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		var doc explainJSON
		b.ctl(t, "explain", "-json", "r", "t").ok(t).decode(t, &doc)
		if doc.TaskInstance.TaskID != "t" || doc.TaskInstance.HeldAt == nil || doc.Run.RunID != "r" ||
			doc.Run.State != sdk.RunRunning {
			t.Fatalf("row %+v run %+v", doc.TaskInstance, doc.Run)
		}
		if len(doc.Decisions) != 3 || len(doc.Log) != 1 {
			t.Fatalf("%d decisions, %d log lines", len(doc.Decisions), len(doc.Log))
		}
		d := doc.Decisions[0]
		if d.Label != sdk.LabelAgentLostProcessAlive || d.Outcome != "deferred" || d.Applied || d.Try == nil ||
			*d.Try != 1 || d.Epoch == nil || *d.Epoch != 0 || d.Evidence["liveness"] != "alive" ||
			!d.At.Equal(base.Add(-5*time.Minute)) || d.Term != b.term || d.Reaper != "agentlost" {
			t.Fatalf("first decision %+v", d)
		}
		if run := doc.Decisions[2]; run.TaskID != "" || run.Try != nil || run.Outcome != "no-op" {
			t.Fatalf("run-level decision %+v", run)
		}
		if doc.Log[0].Line != "agent_lost: agent and task group gone" || doc.Log[0].Try != 1 {
			t.Fatalf("log %+v", doc.Log)
		}
	})

	t.Run("NamesTheReplicaThatWroteADecision", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		replica := board.New(b.pool, board.Options{Holder: "host-b/77/abcd"})
		if err := replica.RecordDecisions(context.Background(), b.term, base.Add(-time.Minute), []sdk.Decision{{Reaper: "agentlost",
			Label: sdk.LabelAgentLostProcessAlive, Attempt: first("r", "t")}}); err != nil {
			t.Fatal(err)
		}
		r := b.ctl(t, "explain", "r", "t").ok(t)
		if !strings.Contains(r.stdout, "(1m ago), term 1 by host-b/77/abcd: agentlost judged try 1 epoch 0") ||
			!strings.Contains(r.stdout, "(5m ago), term 1: agentlost judged") {
			t.Errorf("explain names the holder of the decision that has one, only:\n%s", r.stdout)
		}
		var doc explainJSON
		b.ctl(t, "explain", "-json", "r", "t").ok(t).decode(t, &doc)
		if n := len(doc.Decisions); n != 4 || doc.Decisions[n-1].Holder != "host-b/77/abcd" || doc.Decisions[0].Holder != "" {
			t.Errorf("decisions' holders: %+v", doc.Decisions)
		}
	})

	t.Run("LimitTellsTheNewestAndSaysOlderWereLeftOut", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		r := b.ctl(t, "explain", "r", "t", "-limit", "1").ok(t)
		for _, want := range []string{
			"1 decision, oldest first (1 no-op):",
			"orphanrun judged the run",
			"(older decisions left out: raise -limit, or -limit 0 for all)",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Fatalf("output lacks %q:\n%s", want, r.stdout)
			}
		}
		var doc explainJSON
		b.ctl(t, "explain", "-json", "-limit", "2", "r", "t").ok(t).decode(t, &doc)
		if len(doc.Decisions) != 2 || !doc.OlderOmitted || doc.Decisions[0].Label != sdk.LabelAgentLost {
			t.Fatalf("document %+v", doc)
		}
		b.ctl(t, "explain", "-json", "-limit", "0", "r", "t").ok(t).decode(t, &doc)
		if len(doc.Decisions) != 3 || doc.OlderOmitted {
			t.Fatalf("-limit 0: %d decisions, older omitted %v", len(doc.Decisions), doc.OlderOmitted)
		}
	})

	t.Run("UnknownRunOrTask", func(t *testing.T) {
		t.Parallel()
		b := explainBoard(t)
		b.ctl(t, "explain", "nope", "t").failed(t, 1, `no run "nope"`)
		b.ctl(t, "explain", "r", "nope").failed(t, 1, `run "r" has no task "nope"`)
	})
}
