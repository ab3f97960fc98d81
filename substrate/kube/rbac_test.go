package kube

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/host/leader/kubelease"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// manifest is the shipped least-privilege Role.
const manifest = "../../deploy/kube/rbac.yaml"

// roleRules reads the rules of the shipped Roles (the pods Role of the task
// namespace and the Lease Role of reaperd's), together: the tests here bind
// them in one namespace.
func roleRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	return manifestRules(t, "Role")
}

// clusterRoleRules reads the ClusterRole's rules from the shipped manifest.
func clusterRoleRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	return manifestRules(t, "ClusterRole")
}

// manifestRules reads the rules of every object of kind in the shipped
// manifest.
func manifestRules(t testing.TB, kind string) []rbacv1.PolicyRule {
	t.Helper()
	f, err := os.Open(manifest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var rules []rbacv1.PolicyRule
	for {
		var obj struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", manifest, err)
		}
		if obj.Kind == kind {
			rules = append(rules, obj.Rules...)
		}
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no %s", manifest, kind)
	}
	return rules
}

// withoutVerb drops verb from every rule.
func withoutVerb(rules []rbacv1.PolicyRule, verb string) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, len(rules))
	for i, r := range rules {
		r.Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == verb })
		out[i] = r
	}
	return out
}

// bindRole creates a Role with rules in the env's namespace and binds it to
// user, then waits until the authorizer sees the binding.
func bindRole(t testing.TB, e *env, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reaperd"}, Rules: rules}
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reaperd"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reaperd"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer reads RBAC objects from its own informer: wait until it
	// allows the user to list pods here.
	e.waitFor("the binding to take effect", func() bool {
		r, err := e.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authv1.ResourceAttributes{Namespace: e.ns, Verb: "list", Resource: "pods"}}},
			metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
}

// bindClusterRole creates a ClusterRole with rules, named for the env's
// namespace, binds it to user, and removes both when the test ends; then
// waits until the authorizer sees the binding.
func bindClusterRole(t testing.TB, e *env, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	name := "reaperd-nodes-" + e.ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := e.cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := e.cs.RbacV1().ClusterRoleBindings().Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = e.cs.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	e.waitFor("the cluster binding to take effect", func() bool {
		r, err := e.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authv1.ResourceAttributes{Verb: "get", Resource: "nodes"}}},
			metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
}

// onMissingNode binds a pod to a node no one made: it stays Pending with
// no Ready condition, so its node is read.
func onMissingNode(p *corev1.Pod) { p.Spec.NodeName = "no-such-node" }

func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bindRole(t, e, kubetest.Alice, roleRules(t))
	bindClusterRole(t, e, kubetest.Alice, clusterRoleRules(t))
	s, _, _ := e.substrateAs(kubetest.Alice, nil)
	ctx := context.Background()

	// The node of a pod that hints at a lost node is read: allowed by the
	// ClusterRole, refused (a node error, which defers) without it.
	t.Run("TheNodeOfAPodThatHintsAtALostNodeRead", func(t *testing.T) {
		a := att("on-missing-node")
		e.create(a, false, onMissingNode)
		l := liveness(t, s, true, a)[0]
		if l.State != sdk.Alive || l.NodeError != "" || l.Node != "" || !strings.Contains(l.Detail, "no-such-node") {
			t.Fatalf("liveness as the roles' user: %+v", l)
		}
		// Bob holds the Role alone.
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reaperd-bob"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reaperd"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubetest.Bob}}}
		if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFor("Bob's binding to take effect", func() bool {
			r, err := e.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
				User: kubetest.Bob, ResourceAttributes: &authv1.ResourceAttributes{Namespace: e.ns, Verb: "list", Resource: "pods"}}},
				metav1.CreateOptions{})
			return err == nil && r.Status.Allowed
		})
		bob, _, _ := e.substrateAs(kubetest.Bob, nil)
		l = liveness(t, bob, true, a)[0]
		if l.State != sdk.Alive || !strings.Contains(l.NodeError, "forbidden") || l.Node != "" {
			t.Fatalf("liveness without the ClusterRole: %+v", l)
		}
	})

	t.Run("EverySubstrateCallAllowed", func(t *testing.T) {
		started, never := att("started"), att("never")
		startedPod, neverPod := e.running(started), e.create(never, false)
		e.synced(s) // list and watch
		for _, l := range liveness(t, s, true, started, never) {
			if l.State != sdk.Alive {
				t.Fatalf("liveness as the Role's user: %+v", l)
			}
		}
		if _, err := s.WarmWorkers(ctx); err != nil {
			t.Fatalf("warm workers as the Role's user: %v", err)
		}
		if out := teardown(t, s, sdk.TeardownRequest{Attempt: &started}); out[0].Action != sdk.TeardownStoppedInPlace {
			t.Fatalf("stop in place as the Role's user: %+v", out) // patch
		}
		if out := teardown(t, s, sdk.TeardownRequest{Attempt: &never}); out[0].Action != sdk.TeardownDeleted {
			t.Fatalf("delete as the Role's user: %+v", out)
		}
		// Their Events, written under the Role's events rule (create).
		e.eventsOn(startedPod, neverPod)
		if n := e.eventer(s).counts().failed; n != 0 {
			t.Fatalf("%d Event writes failed as the Role's user", n)
		}
	})
	// The Lease rule names its Lease and grants no create (no rule can hold
	// a create to one name): the manifest makes the Lease, reaperd takes it
	// with get and update, and any other Lease is out of reach.
	t.Run("TheLeaseAllowedByName", func(t *testing.T) {
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "reaperd"}}
		if _, err := e.cs.CoordinationV1().Leases(e.ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err) // as the manifest's Lease object does
		}
		l, err := kubelease.New(kubelease.Config{Namespace: e.ns, Name: "reaperd", Client: e.c.ClientFor(t, kubetest.Alice)}, &countingTerms{})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if _, ok, err := l.TryAcquire(ctx, "alice-1", 15*time.Second, now); err != nil || !ok {
			t.Fatalf("acquire (get, update): %v, %v", ok, err)
		}
		if ok, err := l.Renew(ctx, 1, "alice-1", 15*time.Second, now.Add(time.Second)); err != nil || !ok {
			t.Fatalf("renew (get, update): %v, %v", ok, err)
		}
		if err := l.Resign(ctx, 1, "alice-1"); err != nil {
			t.Fatalf("release (get, update): %v", err)
		}
	})
	t.Run("AnotherLeaseDenied", func(t *testing.T) {
		other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "someone-else"}}
		if _, err := e.cs.CoordinationV1().Leases(e.ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		alice := e.c.ClientFor(t, kubetest.Alice).CoordinationV1().Leases(e.ns)
		if _, err := alice.Get(ctx, "someone-else", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("get another Lease: %v, want Forbidden", err)
		}
		if _, err := alice.Update(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("update another Lease: %v, want Forbidden", err)
		}
		fresh := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "new-lease"}}
		if _, err := alice.Create(ctx, fresh, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("create a Lease: %v, want Forbidden", err)
		}
		// Without its Lease, reaperd's elector is refused, not granted a
		// create: the acquisition fails and it leads nothing.
		l, err := kubelease.New(kubelease.Config{Namespace: e.ns, Name: "missing", Client: e.c.ClientFor(t, kubetest.Alice)}, &countingTerms{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok, err := l.TryAcquire(ctx, "alice-1", 15*time.Second, time.Now()); ok || !apierrors.IsForbidden(err) {
			t.Errorf("acquire a Lease the manifest did not make: ok=%v, %v; want a forbidden error", ok, err)
		}
	})
	t.Run("CallsOutsideTheRoleDenied", func(t *testing.T) {
		alice := e.c.ClientFor(t, kubetest.Alice)
		other := e.c.NewNamespace(t)
		denied := []struct {
			name string
			call func(kubernetes.Interface) error
		}{
			{"PodsOfAnotherNamespace", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Pods(other).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"SecretsOfItsNamespace", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"PodStatus", func(c kubernetes.Interface) error {
				p := e.running(att("status"))
				_, err := c.CoreV1().Pods(e.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
				return err
			}},
			// Events: create and patch of events.k8s.io Events in the
			// task namespace, nothing else.
			{"EventsOfAnotherNamespace", func(c kubernetes.Interface) error {
				_, err := c.EventsV1().Events(other).Create(ctx, testEvent(other), metav1.CreateOptions{})
				return err
			}},
			{"CoreEvents", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Events(e.ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "core-"},
					InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: e.ns, Name: "p"}, Reason: "Test"}, metav1.CreateOptions{})
				return err
			}},
			{"EventsList", func(c kubernetes.Interface) error {
				_, err := c.EventsV1().Events(e.ns).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"EventsDelete", func(c kubernetes.Interface) error {
				return c.EventsV1().Events(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			}},
			{"PodsClusterWide", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"NodesList", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				return err
			}},
			{"NodesWatch", func(c kubernetes.Interface) error {
				w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
				if err == nil {
					w.Stop()
				}
				return err
			}},
			{"NodeStatus", func(c kubernetes.Interface) error {
				n, err := e.cs.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
				if err != nil {
					return err
				}
				_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
				return err
			}},
			{"NodeDelete", func(c kubernetes.Interface) error {
				return c.CoreV1().Nodes().Delete(ctx, e.node, metav1.DeleteOptions{})
			}},
		}
		for _, d := range denied {
			if err := d.call(alice); !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v, want Forbidden", d.name, err)
			}
		}
	})
}

// testEvent is an events.k8s.io Event regarding a pod of ns.
func testEvent(ns string) *eventsv1.Event {
	return &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}, EventTime: metav1.NowMicro(),
		Regarding: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: "p"},
		Type:      corev1.EventTypeNormal, Reason: "Test", Action: "Test", ReportingController: EventsController,
		ReportingInstance: "test"}
}

// countingTerms is a board lease that grants every acquisition a new term.
type countingTerms struct{ term int64 }

func (c *countingTerms) TryAcquire(context.Context, string, time.Duration, time.Time) (int64, bool, error) {
	c.term++
	return c.term, true, nil
}

func (c *countingTerms) Renew(context.Context, int64, string, time.Duration, time.Time) (bool, error) {
	return true, nil
}

func (c *countingTerms) Resign(context.Context, int64, string) error { return nil }
