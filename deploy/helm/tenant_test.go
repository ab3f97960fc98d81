package helm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
	"github.com/dexaflow/reaper/testkit/eventually"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// The Secrets reaperd reads in the tenant tests' renders: the database's
// (the chart's default name), the attempt API's, one of extraVolumes and
// one named in admissionPolicy.protectedSecrets.
const (
	dbSecret    = "reaper-database"
	tlsSecret   = "reaper-attempt-api-tls"
	keysSecret  = "reaper-attempt-api-keys"
	caSecret    = "reaper-db-ca"
	extraSecret = "reaper-webhook"
)

// tenantLayouts are the two ways the chart places the task pods, rendered
// with the kube runner on (so every Secret of reaperd is named) and the test
// cluster's ReplicaSet controller (the controller manager's own user here)
// named, so that reaperd's own replicas are made in the shared layout.
var tenantLayouts = []struct {
	name string
	args func(release string) []string
}{
	{"OwnNamespace", func(string) []string { return nil }},
	{"ReleaseNamespaceAcknowledged", func(release string) []string {
		return []string{"--set", "taskNamespace.name=" + release, "--set", "taskNamespace.allowReleaseNamespace=true"}
	}},
}

func tenantArgs() []string {
	return append([]string{"--set", "config.runner.enabled=true", "--set", "config.runner.kube.image=task:1",
		"--set", "extraVolumes[0].name=db-ca", "--set", "extraVolumes[0].secret.secretName=" + caSecret,
		"--set", "extraVolumeMounts[0].name=db-ca", "--set", "extraVolumeMounts[0].mountPath=/etc/reaper-db-ca",
		"--set", "admissionPolicy.protectedSecrets[0]=" + extraSecret,
		"--set", "admissionPolicy.replicaSetControllers[0]=kube-controller-manager"}, attemptAPISecrets...)
}

// plainPod is an ordinary pod of name with mod applied.
func plainPod(name string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "mine"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "tenant"}}}}
	if mod != nil {
		mod(p)
	}
	return p
}

func secretVolume(secret string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "s",
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}})
	}
}

// TestChartAdmissionPolicyKeepsTenantsFromReaperdsSecretsAndServiceAccount
// applies the chart to the real API server in both layouts (the task pods
// in a namespace of their own, the default; and in the release's,
// acknowledged) and, as a tenant bound to pod rights in the task
// namespace, tries every way a pod could reach what is reaperd's: run as
// its ServiceAccount, mount one of its Secrets (a secret volume, a
// projected source, an env secretKeyRef, an envFrom secretRef, in a
// container, an init container or an added ephemeral container), pass for
// one of its replicas, or make, join or leave the warm pool. Each is
// refused by the policy and leaves nothing behind; the tenant's own
// ordinary pod, reading its own Secret, is let in; reaperd's ServiceAccount
// still creates task pods and warm workers; and in the shared layout the
// Deployment's replicas are still made.
func TestChartAdmissionPolicyKeepsTenantsFromReaperdsSecretsAndServiceAccount(t *testing.T) {
	for _, layout := range tenantLayouts {
		t.Run(layout.name, func(t *testing.T) {
			c := kubetest.Current(t)
			release := c.NewNamespace(t)
			e := applyPolicyIn(t, release, append(tenantArgs(), layout.args(release)...)...)
			ctx := context.Background()
			ns := e.tasks
			if shared := ns == e.release; shared != (layout.name == "ReleaseNamespaceAcknowledged") {
				t.Fatalf("task namespace %s, release %s", ns, e.release)
			}

			// refused: err is the policy's refusal by the rule whose
			// message holds rule, and the pod name (if any) was not made.
			refused := func(t *testing.T, what, rule, name string, err error) {
				t.Helper()
				if !refusedByPolicy(err) || !strings.Contains(err.Error(), rule) {
					t.Fatalf("%s: %v, want refused by the policy's rule %q", what, err, rule)
				}
				if _, err := e.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); name != "" && !apierrors.IsNotFound(err) {
					t.Fatalf("%s: the refused pod exists (%v)", what, err)
				}
			}
			create := func(p *corev1.Pod) error {
				_, err := e.tenant.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
				return err
			}

			t.Run("APodRunningAsReaperdsServiceAccountIsRefused", func(t *testing.T) {
				refused(t, "serviceAccountName", "runs as its ServiceAccount reaper", "as-reaperd",
					create(plainPod("as-reaperd", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "reaper" })))
				refused(t, "the deprecated serviceAccount field", "runs as its ServiceAccount reaper", "as-reaperd-old",
					create(plainPod("as-reaperd-old", func(p *corev1.Pod) { p.Spec.DeprecatedServiceAccount = "reaper" })))
			})
			t.Run("APodReadingReaperdsSecretsIsRefused", func(t *testing.T) {
				for name, mod := range map[string]func(*corev1.Pod){
					"volume-db":    secretVolume(dbSecret),
					"volume-ca":    secretVolume(caSecret),
					"volume-extra": secretVolume(extraSecret),
					"projected-keys": func(p *corev1.Pod) {
						p.Spec.Volumes = []corev1.Volume{{Name: "p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
							Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
								{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: keysSecret}}}}}}}}
					},
					"env-tls": func(p *corev1.Pod) {
						p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
							SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: tlsSecret}, Key: "tls.key"}}}}
					},
					"envfrom-db": func(p *corev1.Pod) {
						p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: dbSecret}}}}
					},
					"init-env-keys": func(p *corev1.Pod) {
						p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "tenant", Env: []corev1.EnvVar{{Name: "K",
							ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
								LocalObjectReference: corev1.LocalObjectReference{Name: keysSecret}, Key: "keys.hcl"}}}}}}
					},
				} {
					refused(t, name, "reads its Secrets", name, create(plainPod(name, mod)))
				}
			})
			t.Run("AForgedReplicaIsRefused", func(t *testing.T) {
				// Reaperd's selector labels and a ReplicaSet owner of its
				// Deployment's name: only the ReplicaSet controller's
				// request is let through, never the tenant's.
				forged := plainPod("forged-replica", func(p *corev1.Pod) {
					p.Labels = map[string]string{"app.kubernetes.io/name": "reaper", "app.kubernetes.io/instance": "reaper"}
					p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "reaper-5d8f7c",
						UID: "00000000-0000-0000-0000-000000000001", Controller: ptr(true)}}
					p.Spec.ServiceAccountName = "reaper"
					secretVolume(dbSecret)(p)
				})
				refused(t, "a pod passing for one of reaperd's replicas", "only reaperd", forged.Name, create(forged))
			})
			t.Run("ATenantsOwnPodAndSecretAreLeftAlone", func(t *testing.T) {
				if err := create(plainPod("mine", secretVolume("tenant-secret"))); err != nil {
					t.Fatalf("a tenant's pod reading its own Secret: %v", err)
				}
			})
			t.Run("AnEphemeralContainerReadingReaperdsSecretIsRefused", func(t *testing.T) {
				p, err := e.tenant.CoreV1().Pods(ns).Get(ctx, "mine", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
					EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "tenant",
						EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: dbSecret}}}}}})
				_, err = e.tenant.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, p.Name, p, metav1.UpdateOptions{})
				refused(t, "an ephemeral container with envFrom the DSN Secret", "reads its Secrets", "", err)
				got, err := e.admin.CoreV1().Pods(ns).Get(ctx, "mine", metav1.GetOptions{})
				if err != nil || len(got.Spec.EphemeralContainers) != 0 {
					t.Fatalf("ephemeral containers after the refusal: %v (%v)", got.Spec.EphemeralContainers, err)
				}
			})
			t.Run("TheWarmPoolLabelIsReaperds", func(t *testing.T) {
				refused(t, "a fake warm worker", "create a pod carrying the label leoflow.io/warm-pool", "fake-worker", create(plainPod("fake-worker", func(p *corev1.Pod) {
					p.Labels[kube.LabelWarmPool] = "default"
				})))
				_, err := e.tenant.CoreV1().Pods(ns).Patch(ctx, "mine", types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"leoflow.io/warm-pool":"default"}}}`), metav1.PatchOptions{})
				refused(t, "relabelling a pod into the warm pool", "its leoflow.io/warm-pool label", "", err)
				worker := plainPod("worker-1", func(p *corev1.Pod) { p.Labels = map[string]string{kube.LabelWarmPool: "default"} })
				if _, err := e.reaperd.CoreV1().Pods(ns).Create(ctx, worker, metav1.CreateOptions{}); err != nil {
					t.Fatalf("reaperd's own warm worker refused: %v", err)
				}
				for _, patch := range []string{`{"metadata":{"labels":{"leoflow.io/warm-pool":null}}}`,
					`{"metadata":{"labels":{"leoflow.io/warm-pool":"other"}}}`} {
					_, err := e.tenant.CoreV1().Pods(ns).Patch(ctx, worker.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
					refused(t, "tenant patch "+patch+" of a warm worker", "its leoflow.io/warm-pool label", "", err)
				}
				got, err := e.admin.CoreV1().Pods(ns).Get(ctx, worker.Name, metav1.GetOptions{})
				if err != nil || got.Labels[kube.LabelWarmPool] != "default" {
					t.Fatalf("the warm worker's label after the refusals: %v (%v)", got.Labels, err)
				}
			})
			t.Run("ReaperdStillCreatesTaskPods", func(t *testing.T) {
				a := sdk.Attempt{RunID: "run-1", TaskID: "load_a", Try: 1, Epoch: 1}
				if _, err := e.reaperd.CoreV1().Pods(ns).Create(ctx, taskPod("task-1", a), metav1.CreateOptions{}); err != nil {
					t.Fatalf("reaperd's own task pod refused: %v", err)
				}
			})
			if ns == e.release && c.HasControllerManager() {
				t.Run("ReaperdsReplicasAreStillMade", func(t *testing.T) {
					// Those made before the policy took effect prove
					// nothing: delete them, and wait for two new ones.
					sel := labels.Set{"app.kubernetes.io/name": "reaper", "app.kubernetes.io/instance": "reaper"}.String()
					replicas := func(skip map[types.UID]bool) []corev1.Pod {
						list, err := e.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
						if err != nil {
							t.Fatalf("list reaperd's pods: %v", err)
						}
						var out []corev1.Pod
						for _, p := range list.Items {
							if !skip[p.UID] && p.DeletionTimestamp == nil {
								out = append(out, p)
							}
						}
						return out
					}
					var pods []corev1.Pod
					wait := func(what string, skip map[types.UID]bool) {
						t.Helper()
						if !eventually.Until(time.Minute, func() bool { pods = replicas(skip); return len(pods) == 2 },
							eventually.Every(100*time.Millisecond)) {
							t.Fatalf("%s: %d of the Deployment's 2 replicas", what, len(pods))
						}
					}
					wait("before the deletion", nil)
					old := map[types.UID]bool{}
					for _, p := range pods {
						old[p.UID] = true
						if err := e.admin.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil && !apierrors.IsNotFound(err) {
							t.Fatalf("delete %s: %v", p.Name, err)
						}
					}
					wait("made again beside the policy", old)
				})
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestChartTaskNamespaceIsNotTheReleasesByDefault renders the chart and
// checks where each object goes: by default the task pods' Role and
// binding, the admission policy's binding, the substrate's namespace and
// the NetworkPolicy's peers name a namespace the chart creates apart from
// the release's, which keeps reaperd's ServiceAccount, Lease and Secrets;
// the release's namespace as task namespace is refused, with the value
// that accepts it named, unless acknowledged; and the old key says where
// it went.
func TestChartTaskNamespaceIsNotTheReleasesByDefault(t *testing.T) {
	const release, tasks = "reaper-system", "reaper-system-tasks"
	objs := render(t, release, append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1")...)
	t.Run("TheChartCreatesTheTaskNamespace", func(t *testing.T) {
		n := find(t, objs, "Namespace", tasks)
		if n.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("the task namespace's annotations %v: helm uninstall would delete it, and its running task pods", n.GetAnnotations())
		}
	})
	t.Run("TaskPodObjectsFollowTheTaskNamespace", func(t *testing.T) {
		for _, kn := range [][2]string{{"Role", "reaper"}, {"RoleBinding", "reaper"}, {"ServiceAccount", "reaper-task"}} {
			if ns := find(t, objs, kn[0], kn[1]).GetNamespace(); ns != tasks {
				t.Errorf("%s %s in %q, want the task namespace %s", kn[0], kn[1], ns, tasks)
			}
		}
		for _, kn := range [][2]string{{"Role", "reaper-leader"}, {"RoleBinding", "reaper-leader"},
			{"ServiceAccount", "reaper"}, {"Lease", "reaper"}, {"Deployment", "reaper"}} {
			if ns := find(t, objs, kn[0], kn[1]).GetNamespace(); ns != release {
				t.Errorf("%s %s in %q, want the release's %s", kn[0], kn[1], ns, release)
			}
		}
		binding := find(t, objs, "ValidatingAdmissionPolicyBinding", "reaper-system-reaper-task-pods")
		if ns, _, _ := unstructured.NestedString(binding.Object, "spec", "matchResources", "namespaceSelector", "matchLabels",
			"kubernetes.io/metadata.name"); ns != tasks {
			t.Errorf("the admission policy binds %q, want %s", ns, tasks)
		}
		if hcl := configOf(t, objs, "reaper"); !strings.Contains(hcl, "substrate \"kube\" {\n  namespace = \""+tasks+"\"") {
			t.Errorf("the kube substrate (and so the runner) is not in %s:\n%s", tasks, hcl)
		}
		np := convertNP(t, find(t, objs, "NetworkPolicy", "reaper"))
		var peers []string
		for _, r := range np.Spec.Ingress {
			for _, p := range r.From {
				peers = append(peers, p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
			}
		}
		if strings.Join(peers, " ") != "monitoring "+tasks+" "+tasks {
			t.Errorf("NetworkPolicy peers' namespaces %v, want monitoring and the task namespace twice", peers)
		}
		for _, o := range objs {
			taskSA := o.GetKind() == "ServiceAccount" && o.GetName() == "reaper-task" // the task pods' own
			if o.GetNamespace() == tasks && o.GetKind() != "Role" && o.GetKind() != "RoleBinding" && !taskSA {
				t.Errorf("%s %s rendered in the task namespace", o.GetKind(), o.GetName())
			}
		}
	})
	t.Run("AnExistingTaskNamespaceIsNotCreated", func(t *testing.T) {
		got := render(t, release, "--set", "taskNamespace.create=false", "--set", "taskNamespace.name=batch")
		if k := kinds(got); strings.Contains(k, "Namespace//") || !strings.Contains(k, "Role/batch/reaper") {
			t.Errorf("taskNamespace.create=false, name=batch: %s", k)
		}
	})
	t.Run("TheReleasesNamespaceIsRefusedUnlessAcknowledged", func(t *testing.T) {
		for _, args := range [][]string{
			{"--set", "taskNamespace.name=" + release},
			{"--set", "taskNamespace.name=" + release, "--set", "taskNamespace.create=false"},
		} {
			out, err := helm(t, append([]string{"template", "reaper", chartDir, "--namespace", release}, args...)...)
			if err == nil || !strings.Contains(out, "taskNamespace.name: the task pods would share the release's namespace "+release+
				" with reaperd's Secrets and ServiceAccount") || !strings.Contains(out, "taskNamespace.allowReleaseNamespace=true") {
				t.Errorf("%v: %v\n%s", args, err, out)
			}
		}
		shared := render(t, release, "--set", "taskNamespace.name="+release, "--set", "taskNamespace.allowReleaseNamespace=true")
		if k := kinds(shared); strings.Contains(k, "Namespace//") || !strings.Contains(k, "Role/"+release+"/reaper ") {
			t.Errorf("acknowledged: %s", k)
		}
	})
	t.Run("TheOldKeyNamesTheNewOne", func(t *testing.T) {
		out, err := helm(t, "template", "reaper", chartDir, "--set", "config.kube.namespace=tasks")
		if err == nil || !strings.Contains(out, "config.kube.namespace has moved: name the task namespace with taskNamespace.name") {
			t.Errorf("config.kube.namespace: %v\n%s", err, out)
		}
	})
}

// notes renders the chart's NOTES.txt as helm install prints it (a
// client-side dry run: Helm asks the test cluster its version, and sends
// nothing).
func notes(t *testing.T, release string, args ...string) string {
	t.Helper()
	out, err := helm(t, append([]string{"install", "reaper", chartDir, "--namespace", release, "--dry-run=client",
		"--kubeconfig", kubetest.Current(t).Kubeconfig()}, args...)...)
	if err != nil {
		t.Fatalf("helm install --dry-run=client %v: %v\n%s", args, err, out)
	}
	_, n, ok := strings.Cut(out, "NOTES:\n")
	if !ok {
		t.Fatalf("no NOTES in:\n%s", out)
	}
	return n
}

// TestChartNotesSayWhatTheSharedNamespaceGrants: acknowledged, the notes
// name the Secrets and the ServiceAccount the tenants share a namespace
// with, and what they are worth; with the policy off, that pods/create
// alone reaches them. The default notes name the task namespace the chart
// made.
func TestChartNotesSayWhatTheSharedNamespaceGrants(t *testing.T) {
	const release = "reaper-system"
	shared := []string{"--set", "taskNamespace.name=" + release, "--set", "taskNamespace.allowReleaseNamespace=true"}
	n := notes(t, release, append(append(shared, attemptAPISecrets...), "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1")...)
	flat := strings.Join(strings.Fields(n), " ")
	for _, want := range []string{
		"WARNING: the task pods share the release's namespace reaper-system",
		"Secrets (reaper-attempt-api-keys, reaper-attempt-api-tls, reaper-database)",
		"ServiceAccount reaper",
		"The admission policy refuses a pod that runs as that ServiceAccount or reads those Secrets",
		"whoever may create Deployments or ReplicaSets there can make a pod that passes for one of reaperd's replicas",
		"the database DSN (the whole board), the attempt API's signing keys (a token for any attempt) and reaperd's identity (its pod rights and its Lease)",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("the acknowledged notes lack %q:\n%s", want, n)
		}
	}
	off := strings.Join(strings.Fields(notes(t, release, append(shared, "--set", "admissionPolicy.enabled=false")...)), " ")
	if !strings.Contains(off, "The admission policy is off (admissionPolicy.enabled=false): whoever may create pods there can mount those Secrets and run a pod as that ServiceAccount, and so holds the database DSN") {
		t.Errorf("the notes with the policy off:\n%s", off)
	}
	def := strings.Join(strings.Fields(notes(t, release)), " ")
	if strings.Contains(def, "WARNING") || !strings.Contains(def, "reaps the task pods of reaper-system-tasks") ||
		!strings.Contains(def, "The chart created the task namespace reaper-system-tasks") {
		t.Errorf("the default notes:\n%s", def)
	}
}
