package kubee2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
	hostdaemon "github.com/dexaflow/reaper/host/daemon"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// unavailableTick is the in-process runner's interval: the fake clock
// moves a tick at a time across the 15 minutes.
const unavailableTick = 30 * time.Second

// Every pod create in the scenario's namespace is answered 500 (a
// validating webhook that cannot be called, failurePolicy Fail: the API
// server's own answer when its admission chain is down) for longer than 15
// minutes of reaperd's fake clock. reaperd runs in process through
// host/daemon on that clock. The task is offered again on a new epoch at
// every runner cycle (dispatch_unavailable) without spending its retry,
// until 15 minutes from the first failure: then dispatch_unavailable_
// exhausted and dispatch_failed, terminal, its retry unspent.
func createUnavailable(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 10, "pod create unavailable > 15 min (fake clock)", c)
	s.retries = 1
	ctx := context.Background()
	fail := admissionv1.Fail
	none := admissionv1.SideEffectClassNone
	url := "https://127.0.0.1:1/validate"
	hook := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-down"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:                    "down.kubee2e.reaper.test",
			ClientConfig:            admissionv1.WebhookClientConfig{URL: &url},
			Rules:                   []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create}, Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": s.ns}},
		}},
	}
	if _, err := s.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), hook.Name, metav1.DeleteOptions{})
	})

	// The Postgres lease (a fake clock cannot drive a Kubernetes Lease's
	// real renew deadlines) and the specification's ladder.
	src := s.configText("leader \"postgres\" {\n  lease = \"24h\"\n}", attemptapitest.FreeAddr(t),
		runnerBlock(unavailableTick))
	cfg, err := config.Parse(filepath.Join(s.dir, "inprocess.hcl"), []byte(src), config.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("parse the in-process configuration: %v", err)
	}
	logf, err := os.Create(filepath.Join(s.dir, "inprocess.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logf.Close() })
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	d, err := hostdaemon.New(ctx, cfg, hostdaemon.Options{Clock: clk,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "reaperd", Output: logf, Level: hclog.Debug})})
	if err != nil {
		t.Fatalf("start the in-process host: %v", err)
	}
	t.Cleanup(d.Close)
	if st := d.Campaign(ctx); !st.Leading {
		t.Fatalf("the in-process host did not lead: %+v", st)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	s.tasks = []taskSpec{{id: "unavailable", want: sdk.StateFailed}}
	start := clk.Now()
	if err := lifecycle.New(s.pool, lifecycle.Options{}).CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "kubee2e",
		State: sdk.RunRunning, Tasks: []lifecycle.NewTask{{TaskID: "unavailable", Executor: sdk.ExecutorKube, Retries: 1,
			Command: "true"}}}, start); err != nil {
		t.Fatal(err)
	}
	// Tick by tick: each cycle is waited for (its decision in the audit)
	// before the clock moves on.
	offered := 0
	var exhausted *decision
	for clk.Now().Sub(start) <= kuberunner.DispatchUnavailableWindowDefault+3*unavailableTick && exhausted == nil {
		clk.Advance(unavailableTick)
		s.eventually(30*time.Second, "the runner's cycle at "+clk.Now().Sub(start).String(), func() bool {
			ds, err := s.decisions()
			if err != nil {
				return false
			}
			n := 0
			for i, d := range ds {
				switch d.Label {
				case sdk.LabelDispatchUnavailable:
					n++
				case sdk.LabelDispatchUnavailableSpent:
					exhausted = &ds[i]
				}
			}
			moved := n > offered || exhausted != nil
			offered = n
			return moved
		})
	}
	if exhausted == nil {
		t.Fatalf("no %s within %s of fake time", sdk.LabelDispatchUnavailableSpent, clk.Now().Sub(start))
	}
	ti, err := s.taskRow("unavailable")
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != sdk.StateFailed || ti.Try != 1 || ti.LastFailureKind == sdk.FailureTask {
		t.Errorf("the task ended %s at try %d (%s: %s %s), want failed at try 1, no retry spent", ti.State, ti.Try,
			ti.LastFailureKind, ti.FailureReason, ti.ErrorMessage)
	}
	ds, err := s.decisions()
	if err != nil {
		t.Fatal(err)
	}
	var first *decision
	for i, d := range ds {
		if d.Label == sdk.LabelDispatchUnavailable && first == nil {
			first = &ds[i]
		}
	}
	if offered < 2 || first == nil || ti.FailureReason != sdk.LabelDispatchFailed {
		t.Fatalf("%d %s decisions; the row's failure %q, want %s", offered, sdk.LabelDispatchUnavailable,
			ti.FailureReason, sdk.LabelDispatchFailed)
	}
	// The window runs from the first failure (dispatch_unavailable_since).
	window := kuberunner.DispatchUnavailableWindowDefault
	f := &fault{what: "pod create unavailable", at: first.At, threshold: window, reapAt: exhausted.At,
		deadline: first.At.Add(window + unavailableTick), settled: exhausted.At.Sub(first.At)}
	f.ok = !exhausted.At.After(f.deadline) && !exhausted.At.Before(first.At.Add(window))
	if !f.ok {
		t.Errorf("exhausted %s after the first failure, want between %s and %s", exhausted.At.Sub(first.At), window,
			window+unavailableTick)
	}
	t.Logf("offered again %d times; exhausted %s after the first failure (fake time)", offered, exhausted.At.Sub(first.At))
	s.row.set([]*fault{f}, s.falseReaps(ds), 0, 0, time.Since(s.started))
}
