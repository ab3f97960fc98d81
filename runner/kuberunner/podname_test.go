package kuberunner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/kubetest/kubelet"
)

// tenant is a client of a plain user (Bob) allowed to create and read pods
// in the env's namespace: what a tenant of the task namespace holds.
func (e *env) tenant(t *testing.T) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant-pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list"}}}}
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.Bob}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs := e.c.ClientFor(t, kubetest.Bob)
	eventually.True(t, clusterWait, "the tenant's role to take effect", func() bool {
		_, err := cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
		return err == nil
	}, eventually.Every(clusterPoll))
	return cs
}

// squat has the tenant create a pod under name; with a, it carries that
// attempt's labels and raw task id annotation (copied, as anyone can).
func squat(t *testing.T, tenant kubernetes.Interface, ns, name string, a *sdk.Attempt) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squat", Image: "registry.invalid/squat"}}}}
	if a != nil {
		p.Labels, p.Annotations = kube.AttemptLabels(*a)
	}
	made, err := tenant.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the tenant's pod %s: %v", name, err)
	}
	return made
}

// untouched fails unless every pod of made is still there as it was made.
func (e *env) untouched(t *testing.T, made ...*corev1.Pod) {
	t.Helper()
	for _, m := range made {
		got, err := e.cs.CoreV1().Pods(e.ns).Get(context.Background(), m.Name, metav1.GetOptions{})
		if err != nil || got.UID != m.UID || got.ResourceVersion != m.ResourceVersion {
			t.Fatalf("the tenant's pod %s: %v (%v): want it untouched", m.Name, got, err)
		}
	}
}

var notLegacyName = regexp.MustCompile(`[^a-z0-9-]+`)

// legacyPodName is the name the runner gave an attempt's pod before names
// carried a dispatch: a function of the attempt alone, which anyone could
// compute ahead of the runner.
func legacyPodName(a sdk.Attempt) string {
	part := func(s string, n int) string {
		s = notLegacyName.ReplaceAllString(strings.ToLower(s), "-")
		if len(s) > n {
			s = s[:n]
		}
		return strings.Trim(s, "-")
	}
	sum := sha256.Sum256([]byte(a.RunID + "\x00" + a.TaskID + "\x00" +
		strconv.Itoa(int(a.Try)) + "\x00" + strconv.Itoa(int(a.Epoch))))
	tail := strconv.Itoa(int(a.Try)) + "-" + strconv.Itoa(int(a.Epoch)) + "-" + hex.EncodeToString(sum[:])[:10]
	head := part(a.RunID, 20) + "-" + part(a.TaskID, 20)
	return strings.TrimLeft(strings.Trim(part(head, 63-len(tail)-1), "-")+"-"+tail, "-")
}

// A tenant with pods/create who takes the names the old scheme gave the
// attempt's pods (its current attempt and the next epochs' to come,
// unlabelled) stops nothing: the runner's pod has a name of its own, the
// attempt runs to its outcome in it (the agent played by the kubelet
// player), the name recorded with the UID is the pod that ran, and the
// tenant's pods are left as they were.
func TestAPodUnderTheOldPredictableNameStopsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	tenant := e.tenant(t)
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "load_a", Command: "true"})
	next := e.ti(t, "run", "load_a").Attempt
	var squats []*corev1.Pod
	for epoch := range int32(3) {
		a := next
		a.Epoch += epoch
		squats = append(squats, squat(t, tenant, e.ns, legacyPodName(a), nil))
	}

	log := &sdktest.LogBuffer{}
	node := e.c.AddNode(t, "").Name
	player, err := kubelet.Start(ctx, kubelet.Config{
		Client: e.cs, Namespace: e.ns, Dir: filepath.Join(t.TempDir(), "containers"),
		Commands: map[string]string{kuberunner.AgentPathDefault: agentBinary(t)}, MaxGrace: time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(player.Stop)
	api := attemptapitest.Start(t, e.w, attemptapitest.Options{Clock: e.clk,
		Logger: hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info, Name: "attempt-api"})})
	cfg := e.config(e.cs)
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.TerminationGrace = time.Second
	cfg.Credentials = kuberunner.MintedCredentials{Minter: api.Issuer, Recorder: e.w}
	cfg.Customize = func(p *corev1.Pod) {
		p.Spec.NodeName = node
		kubelet.Own(p)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("player and API log:\n%s", log.String())
		}
	})
	r := e.runner(t, cfg)
	res := cycle(t, r, e.clk.Now())
	if res.Dispatched != 1 || len(res.Decisions) != 0 {
		t.Fatalf("dispatched %d, decisions %v: want the attempt dispatched and nothing to decide", res.Dispatched, labels(res))
	}
	var ti board.TaskInstance
	eventually.True(t, clusterWait, "the attempt to run to its outcome", func() bool {
		e.clk.Advance(time.Second)
		cycle(t, r, e.clk.Now())
		ti = e.ti(t, "run", "load_a")
		return ti.State == sdk.StateSuccess
	}, eventually.Every(clusterPoll))
	if ti.Attempt != next {
		t.Fatalf("the attempt that ran is %s, want %s on its first dispatch", ti.Attempt, next)
	}
	ours, ok := e.pods(t)[next]
	rec, err := e.w.RecordedPod(ctx, next)
	if !ok || err != nil || rec.Name != ours.Name || rec.UID != string(ours.UID) {
		t.Fatalf("recorded pod %+v (%v), the attempt's pod %s %s", rec, err, ours.Name, ours.UID)
	}
	for _, s := range squats {
		if s.Name == ours.Name {
			t.Fatalf("the attempt's pod %s has a name the tenant could compute", ours.Name)
		}
	}
	e.untouched(t, squats...)
}

// A pod someone put under the attempt's very name (the test reads the name
// from the runner's Customize hook just before the create, as an attacker
// who guessed it would have it) does not fail the task: the attempt fails
// on the infra rail (pod_name_squatted, WARN, confirmed: nothing of it ever
// ran), the next cycle re-places it on its infra budget under a new name,
// and the tenant's pod is left alone. Whether the tenant's pod is
// unlabelled or carries the attempt's very labels and annotation, it is
// never adopted. A tenant who takes every name fails the task once its
// infra budget is spent (infra_budget_spent), never dispatch_failed.
func TestAPodUnderTheAttemptsNameIsASquatRePlacedOnTheInfraRail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tenant := e.tenant(t)
	for name, labelled := range map[string]bool{"Unlabelled": false, "WithTheAttemptsLabels": true} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			runID := "run-" + strings.ToLower(name)
			e.mkRun(t, runID, lifecycle.NewTask{TaskID: "t", Retries: 2})
			var taken *corev1.Pod
			cfg := e.config(e.cs)
			cfg.Customize = func(p *corev1.Pod) {
				if taken != nil {
					return
				}
				var a *sdk.Attempt
				if labelled {
					got, _ := kube.PodAttempt(p.Labels, p.Annotations)
					a = &got
				}
				taken = squat(t, tenant, e.ns, p.Name, a)
			}
			r := e.runner(t, cfg)
			first := e.ti(t, runID, "t").Attempt
			res := cycle(t, r, e.clk.Now())
			if res.Dispatched != 0 || res.Failed != 0 || !slices.Equal(labels(res), []string{sdk.LabelPodNameSquatted}) {
				t.Fatalf("dispatched %d, failed %d, decisions %v: want one pod_name_squatted", res.Dispatched, res.Failed, labels(res))
			}
			d := res.Decisions[0]
			if !d.Applied || d.Evidence["pod"] != taken.Name || d.Evidence["pod_uid"] != string(taken.UID) ||
				d.Evidence["names_attempt"] != strconv.FormatBool(labelled) {
				t.Fatalf("decision %+v: want it applied, naming the tenant's pod %s %s", d, taken.Name, taken.UID)
			}
			if !logged(e.logs.String(), "[WARN]", "decision="+sdk.LabelPodNameSquatted, "pod="+taken.Name) {
				t.Fatalf("want the squat of %s logged at WARN", taken.Name)
			}
			ti := e.ti(t, runID, "t")
			if ti.Attempt != first || ti.State != sdk.StateFailed || ti.LastFailureKind != sdk.FailureInfra ||
				ti.FailureReason != sdk.LabelPodNameSquatted || ti.InfraConfirmedAt.IsZero() || ti.Retries != 2 ||
				!strings.Contains(ti.ErrorMessage, string(taken.UID)) {
				t.Fatalf("row %+v: want %s failed on the infra rail as pod_name_squatted, confirmed, naming the pod, retries kept", ti, first)
			}
			// The name the dispatch drew is recorded with the queue (before
			// the create); the tenant's pod under it never is.
			if rec, err := e.w.RecordedPod(ctx, first); err != nil || rec.UID != "" || !rec.Created.IsZero() {
				t.Fatalf("recorded pod %+v (%v): the tenant's pod was adopted", rec, err)
			}

			e.clk.Advance(time.Second)
			res = cycle(t, r, e.clk.Now())
			if res.Replaced != 1 || res.Dispatched != 1 || !slices.Equal(labels(res), []string{sdk.LabelInfraReplace}) {
				t.Fatalf("replaced %d, dispatched %d, decisions %v: want the attempt re-placed and dispatched", res.Replaced, res.Dispatched, labels(res))
			}
			ti = e.ti(t, runID, "t")
			ours, ok := e.pods(t)[ti.Attempt]
			if ti.Epoch != first.Epoch+1 || ti.Try != first.Try || ti.InfraUsed != 1 || ti.State != sdk.StateQueued || !ok || ours.Name == taken.Name {
				t.Fatalf("row %+v, its pod %q: want the next epoch queued in a pod of another name, one re-place spent", ti, ours.Name)
			}
			if rec, err := e.w.RecordedPod(ctx, ti.Attempt); err != nil || rec.Name != ours.Name || rec.UID != string(ours.UID) {
				t.Fatalf("recorded pod %+v (%v), want %s %s", rec, err, ours.Name, ours.UID)
			}
			if sd, err := e.w.Running(ctx, ti.Attempt, e.clk.Now()); err != nil || sd {
				t.Fatalf("the re-placed attempt's RUNNING report: should_terminate %v (%v)", sd, err)
			}
			e.untouched(t, taken)
		})
	}

	t.Run("EveryNameTakenSpendsTheInfraBudget", func(t *testing.T) {
		e.mkRun(t, "run-every", lifecycle.NewTask{TaskID: "t", Retries: 2, InfraBudget: 2})
		var taken []*corev1.Pod
		cfg := e.config(e.cs)
		cfg.Customize = func(p *corev1.Pod) { taken = append(taken, squat(t, tenant, e.ns, p.Name, nil)) }
		r := e.runner(t, cfg)
		var all []string
		for range 4 {
			all = append(all, labels(cycle(t, r, e.clk.Now()))...)
			e.clk.Advance(time.Second)
		}
		want := []string{sdk.LabelPodNameSquatted, sdk.LabelInfraReplace, sdk.LabelPodNameSquatted,
			sdk.LabelInfraReplace, sdk.LabelPodNameSquatted, sdk.LabelInfraBudgetSpent}
		if !slices.Equal(all, want) {
			t.Fatalf("decisions %v, want %v", all, want)
		}
		ti := e.ti(t, "run-every", "t")
		if ti.State != sdk.StateFailed || ti.FailureReason != sdk.LabelInfraBudgetSpent || ti.Epoch != 2 || ti.Try != 1 {
			t.Fatalf("row %+v: want failed for good as infra_budget_spent on epoch 2, try 1", ti)
		}
		if len(taken) != 3 || taken[0].Name == taken[1].Name || taken[1].Name == taken[2].Name {
			t.Fatalf("%d names taken: want three creates, each under a name of its own", len(taken))
		}
		e.untouched(t, taken...)
	})
}

// lostAnswer is a transport that loses the answer to the first pod create
// it carries: the request reaches the API server (the pod is made), the
// client is told 504 with Retry-After, and client-go sends the same create
// again, which meets AlreadyExists.
type lostAnswer struct {
	next  http.RoundTripper
	posts atomic.Int32
}

func (l *lostAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/pods") || l.posts.Add(1) != 1 {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return &http.Response{StatusCode: http.StatusGatewayTimeout, Status: "504 Gateway Timeout",
		Header: http.Header{"Retry-After": {"0"}, "Content-Type": {"text/plain"}},
		Body:   io.NopCloser(bytes.NewReader([]byte("the answer was lost"))), Request: req}, nil
}

// A create whose first answer was lost, sent again by client-go and met by
// AlreadyExists on the pod the first one made, adopts that pod: it is
// provably the runner's (the attempt's labels and annotation, and this
// dispatch's own random value, which nobody else could have known). The
// attempt is dispatched with that pod's name and UID recorded, and no
// second pod is made.
func TestACreateWhoseAnswerWasLostAdoptsItsOwnPod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	e.mkRun(t, "run", lifecycle.NewTask{TaskID: "t"})
	rc := e.c.AdminConfig()
	lost := &lostAnswer{}
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { lost.next = rt; return lost }
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	res := cycle(t, e.runner(t, e.config(cs)), e.clk.Now())
	if res.Dispatched != 1 || len(res.Decisions) != 0 {
		t.Fatalf("dispatched %d, decisions %v: want the attempt dispatched in the pod its first create made", res.Dispatched, labels(res))
	}
	if n := lost.posts.Load(); n != 2 {
		t.Fatalf("%d creates sent, want 2 (the first one's answer lost)", n)
	}
	if !strings.Contains(e.logs.String(), "adopted") {
		t.Fatal("want the adoption logged")
	}
	ti := e.ti(t, "run", "t")
	pods := e.pods(t)
	ours, ok := pods[ti.Attempt]
	rec, err := e.w.RecordedPod(ctx, ti.Attempt)
	if len(pods) != 1 || !ok || err != nil || rec.Name != ours.Name || rec.UID != string(ours.UID) || ti.State != sdk.StateQueued {
		t.Fatalf("%d pods, row %+v, recorded %+v (%v): want the one pod recorded on the queued attempt", len(pods), ti, rec, err)
	}
}

// logged reports whether a line of log holds every one of parts.
func logged(log string, parts ...string) bool {
	for line := range strings.Lines(log) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}
