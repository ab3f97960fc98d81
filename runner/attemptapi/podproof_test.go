package attemptapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
)

// scriptedPods answers VerifyPod as its test says, recording what it was
// asked. The TokenReview itself is proven against the real API server
// (kuberunner's podproof tests); this drives the server's handling of each
// answer.
type scriptedPods struct {
	mu     sync.Mutex
	answer error
	asked  []string // "token uid"
}

func (p *scriptedPods) VerifyPod(_ context.Context, token, uid string) (attemptapi.PodIdentity, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, token+" "+uid)
	return attemptapi.PodIdentity{PodUID: "uid-presented"}, p.answer
}

// last is the last question asked, and how many were.
func (p *scriptedPods) last() (string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.asked) == 0 {
		return "", 0
	}
	return p.asked[len(p.asked)-1], len(p.asked)
}

func (p *scriptedPods) set(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer = err
}

// TestExchangeProvesItsPod: with a PodVerifier, the exchange of a kube
// attempt's bootstrap, and a warm worker's, must carry a pod token the
// verifier accepts for the pod the board recorded. Without a token, or with
// one the verifier refuses, it is refused exchange_not_from_pod (logged,
// metered, handed on as a decision), and nothing is written: the bootstrap
// stays unspent and the pod's own agent exchanges it afterwards. A pod not
// recorded yet, or a review that fails, is a 503 to retry, never an
// accept. A Lite attempt's exchange is asked for no proof.
func TestExchangeProvesItsPod(t *testing.T) {
	ctx := context.Background()
	pods := &scriptedPods{}
	b := setupWith(t, func(_ *bundle, cfg *attemptapi.ServerConfig) { cfg.Pods = pods })
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("projected-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeAttempt := func(t *testing.T, runID string) (sdk.Attempt, *attemptapi.Client) {
		t.Helper()
		if err := b.w.CreateRun(ctx, lifecycle.NewRun{RunID: runID, DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: "t", Executor: sdk.ExecutorKube, Retries: 1, Command: "true"}}}, base.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		a := sdk.Attempt{RunID: runID, TaskID: "t", Try: 1}
		c, _ := b.dispatchBootstrap(t, a)
		return a, c
	}
	unchanged := func(t *testing.T, a sdk.Attempt, before string) {
		t.Helper()
		if after := b.snapshot(t, a); after != before {
			t.Fatalf("the refused exchange changed the attempt:\nbefore %s\nafter  %s", before, after)
		}
	}

	t.Run("NoPodToken_RefusedNotSpent", func(t *testing.T) {
		a, c := kubeAttempt(t, "no-token")
		if _, err := b.w.RecordPod(ctx, a, "uid-1", time.Time{}, b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		before := b.snapshot(t, a)
		_, err := c.Exchange(ctx, a)
		refusedWith(t, err, attemptapi.CodeNotFromPod)
		unchanged(t, a, before)
		ds := b.decisions.all()
		if d := ds[len(ds)-1]; d.Label != sdk.LabelExchangeNotFromPod || d.Applied || d.Attempt != a ||
			d.Evidence["recorded_pod_uid"] != "uid-1" || !strings.Contains(d.Evidence["why"], "no pod token") {
			t.Fatalf("decision %+v: want %s, not applied, naming the recorded pod", d, sdk.LabelExchangeNotFromPod)
		}
		// The pod's own agent, with its token, exchanges the same bootstrap.
		c.UsePodToken(tokenFile)
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("the pod's own exchange after the refusal: %v %v", term, err)
		}
		if b.exchangedAt(t, a).IsZero() {
			t.Fatal("the accepted exchange was not recorded")
		}
	})
	t.Run("TokenTheVerifierRefuses_RefusedNotSpent", func(t *testing.T) {
		a, c := kubeAttempt(t, "refused")
		if _, err := b.w.RecordPod(ctx, a, "uid-2", time.Time{}, b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		c.UsePodToken(tokenFile)
		pods.set(fmt.Errorf("%w: another pod's", attemptapi.ErrNotFromPod))
		defer pods.set(nil)
		before := b.snapshot(t, a)
		_, err := c.Exchange(ctx, a)
		refusedWith(t, err, attemptapi.CodeNotFromPod)
		unchanged(t, a, before)
		if last, _ := pods.last(); last != "projected-token uid-2" {
			t.Fatalf("the verifier was asked %q, want the presented token against the recorded uid", last)
		}
		if !strings.Contains(b.log.String(), "did not prove it comes from the recorded pod") {
			t.Fatal("the refusal was not logged")
		}
	})
	t.Run("PodNotRecordedYet_Retryable", func(t *testing.T) {
		a, c := kubeAttempt(t, "unrecorded")
		c.UsePodToken(tokenFile)
		before := b.snapshot(t, a)
		_, err := c.Exchange(ctx, a)
		var ce *attemptapi.CallError
		if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable || ce.Body.Code != attemptapi.CodePodNotRecorded ||
			errors.Is(err, attemptapi.ErrRefused) {
			t.Fatalf("%v: want a 503 %s to retry", err, attemptapi.CodePodNotRecorded)
		}
		unchanged(t, a, before)
		if _, err := b.w.RecordPod(ctx, a, "uid-3", time.Time{}, b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		if term, err := c.Exchange(ctx, a); err != nil || term {
			t.Fatalf("the retry once the pod is recorded: %v %v", term, err)
		}
	})
	t.Run("ReviewFails_RetryableNeverAccepted", func(t *testing.T) {
		a, c := kubeAttempt(t, "review-down")
		if _, err := b.w.RecordPod(ctx, a, "uid-4", time.Time{}, b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		c.UsePodToken(tokenFile)
		pods.set(errors.New("token review: connection refused"))
		defer pods.set(nil)
		before := b.snapshot(t, a)
		_, err := c.Exchange(ctx, a)
		var ce *attemptapi.CallError
		if !errors.As(err, &ce) || ce.Status != http.StatusServiceUnavailable || ce.Body.Code != attemptapi.CodePodUnverified {
			t.Fatalf("%v: want a 503 %s to retry", err, attemptapi.CodePodUnverified)
		}
		if strings.Contains(ce.Body.Message, "connection refused") {
			t.Fatalf("the answer carries the review's error text: %q", ce.Body.Message)
		}
		unchanged(t, a, before)
	})
	t.Run("LiteAttempt_NoProofAsked", func(t *testing.T) {
		b.run(t, "lite", "t")
		a := sdk.Attempt{RunID: "lite", TaskID: "t", Try: 1}
		_, asked := pods.last()
		b.dispatch(t, a)
		if _, now := pods.last(); now != asked {
			t.Fatal("a Lite attempt's exchange was asked for a pod proof")
		}
	})
	t.Run("WarmWorker", func(t *testing.T) {
		cred, err := b.issuer.MintWorkerBootstrap("w1", b.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		c, err := attemptapi.NewClient(b.url, cred.Token, b.ca)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		refusedWith(t, c.ExchangeWorker(ctx, "w1"), attemptapi.CodeNotFromPod)
		c.UsePodToken(tokenFile)
		var ce *attemptapi.CallError
		if err := c.ExchangeWorker(ctx, "w1"); !errors.As(err, &ce) || ce.Body.Code != attemptapi.CodePodNotRecorded {
			t.Fatalf("%v: want %s before the worker's pod is recorded", err, attemptapi.CodePodNotRecorded)
		}
		if err := b.w.RecordWarmWorkerPod(ctx, "w1", "uid-w1", time.Hour, b.clk.Now()); err != nil {
			t.Fatal(err)
		}
		pods.set(fmt.Errorf("%w: another pod's", attemptapi.ErrNotFromPod))
		refusedWith(t, c.ExchangeWorker(ctx, "w1"), attemptapi.CodeNotFromPod)
		pods.set(nil)
		if err := c.ExchangeWorker(ctx, "w1"); err != nil {
			t.Fatalf("the worker's own exchange after the refusals: %v", err)
		}
		if last, _ := pods.last(); last != "projected-token uid-w1" {
			t.Fatalf("the verifier was asked %q, want the worker's recorded pod", last)
		}
	})
	if n := b.meter.Count(attemptapi.CallExchange + "/" + attemptapi.CodeNotFromPod); n != 2 {
		t.Fatalf("refused exchanges metered %d times, want 2", n)
	}
	if n := b.meter.Count(attemptapi.CallWorkerExchange + "/" + attemptapi.CodeNotFromPod); n != 2 {
		t.Fatalf("refused worker exchanges metered %d times, want 2", n)
	}
}
