package kube

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/host/leader/kubelease"
	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/sdk"
)

// manifest is the shipped least-privilege Role.
const manifest = "../../deploy/kube/rbac.yaml"

// roleRules reads the Role's rules from the shipped manifest.
func roleRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	f, err := os.Open(manifest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var obj struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s has no Role", manifest)
		}
		if err != nil {
			t.Fatalf("reading %s: %v", manifest, err)
		}
		if obj.Kind == "Role" {
			return obj.Rules
		}
	}
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

func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bindRole(t, e, kubetest.Alice, roleRules(t))
	s, _, _ := e.substrateAs(kubetest.Alice, nil)
	ctx := context.Background()

	t.Run("EverySubstrateCallAllowed", func(t *testing.T) {
		started, never := att("started"), att("never")
		e.running(started)
		e.create(never, false)
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
	})
	t.Run("TheLeaseAllowed", func(t *testing.T) {
		l, err := kubelease.New(kubelease.Config{Namespace: e.ns, Name: "reaperd", Client: e.c.ClientFor(t, kubetest.Alice)}, &countingTerms{})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if _, ok, err := l.TryAcquire(ctx, "alice-1", 15*time.Second, now); err != nil || !ok {
			t.Fatalf("acquire (get, create): %v, %v", ok, err)
		}
		if ok, err := l.Renew(ctx, 1, "alice-1", 15*time.Second, now.Add(time.Second)); err != nil || !ok {
			t.Fatalf("renew (get, update): %v, %v", ok, err)
		}
		if err := l.Resign(ctx, 1, "alice-1"); err != nil {
			t.Fatalf("release (get, update): %v", err)
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
			{"PodsClusterWide", func(c kubernetes.Interface) error {
				_, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
				return err
			}},
		}
		for _, d := range denied {
			if err := d.call(alice); !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v, want Forbidden", d.name, err)
			}
		}
	})
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
