// Package helm_test checks the Helm chart in reaper/ with a real Helm (built
// pinned from the module proxy with the test cluster, see testkit/kubetest)
// and on a real API server: helm lint, helm template with the default and
// with other values, the rendered objects applied, the ServiceAccount's
// rights asked of the API server's authorizer, and the rendered
// configuration checked by reaperd validate.
package helm_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/dexaflow/reaper/host/telemetry"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const (
	chartDir     = "reaper"
	customValues = "testdata/values-custom.yaml"
	// The reapers, in the order reaperd runs them.
	reaperOrder = "podlost dispatchlost agentlost warmworker orphanrun"
)

// helm runs the cached Helm binary with its own empty home directories, so
// that nothing of the user's Helm setup (repositories, plugins) takes part.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(kubetest.Current(t).Binaries().Helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// render runs helm template for release "reaper" in namespace ns and
// returns the objects, in the order Helm printed them.
func render(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, append([]string{"template", "reaper", chartDir, "--namespace", ns}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	return decodeAll(t, "helm template's output", []byte(out))
}

// decodeAll decodes a multi-document YAML stream into objects.
func decodeAll(t *testing.T, what string, src []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(src), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode %s: %v\n%s", what, err, src)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// find returns the one rendered object of kind and name.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q in the rendered chart (have %s)", kind, name, kinds(objs))
	return nil
}

func kinds(objs []*unstructured.Unstructured) string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, v); err != nil {
		t.Fatalf("convert %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return v
}

// configOf returns the HCL file of the rendered ConfigMap.
func configOf(t *testing.T, objs []*unstructured.Unstructured, name string) string {
	t.Helper()
	cm := convert[corev1.ConfigMap](t, find(t, objs, "ConfigMap", name))
	hcl, ok := cm.Data["reaper.hcl"]
	if !ok {
		t.Fatalf("ConfigMap %s has no reaper.hcl", name)
	}
	return hcl
}

func TestChartLintsStrictWithDefaultAndCustomValues(t *testing.T) {
	for _, args := range [][]string{nil, {"--values", customValues}} {
		out, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...)
		if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Fatalf("helm lint --strict %v: %v\n%s", args, err, out)
		}
	}
	out, err := helm(t, "version", "--short")
	if err != nil || !strings.HasPrefix(out, kubetest.HelmVersion) {
		t.Fatalf("helm version: %v: %q, want %s", err, out, kubetest.HelmVersion)
	}
}

func TestChartTemplateDefaultsRunTwoReplicasOfReaperdWithTheKubernetesLease(t *testing.T) {
	objs := render(t, "reaper-system")
	want := "ClusterRole//reaper-system-reaper-nodes ClusterRoleBinding//reaper-system-reaper-nodes " +
		"ConfigMap/reaper-system/reaper Deployment/reaper-system/reaper Lease/reaper-system/reaper " +
		"Namespace//reaper-system-tasks NetworkPolicy/reaper-system/reaper PodDisruptionBudget/reaper-system/reaper " +
		"Role/reaper-system-tasks/reaper Role/reaper-system/reaper-leader " +
		"RoleBinding/reaper-system-tasks/reaper RoleBinding/reaper-system/reaper-leader " +
		"Service/reaper-system/reaper ServiceAccount/reaper-system/reaper " +
		"ValidatingAdmissionPolicy//reaper-system-reaper-task-pods ValidatingAdmissionPolicyBinding//reaper-system-reaper-task-pods"
	if got := kinds(objs); got != want {
		t.Fatalf("rendered objects:\n got %s\nwant %s", got, want)
	}

	d := convert[appsv1.Deployment](t, find(t, objs, "Deployment", "reaper"))
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != "reaper" {
		t.Errorf("serviceAccountName = %q", pod.ServiceAccountName)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "reaper:0.1.0" {
		t.Errorf("image = %q, want the chart's appVersion", c.Image)
	}
	if got := strings.Join(c.Args, " "); got != "run -config /etc/reaper/reaper.hcl" {
		t.Errorf("args = %q", got)
	}
	checkPodHardening(t, pod)
	checkProbes(t, c, 9464)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources: %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
	if d.Spec.Template.Annotations["checksum/config"] == "" {
		t.Errorf("no checksum/config annotation: a changed configuration would not roll the pods")
	}

	hcl := configOf(t, objs, "reaper")
	for _, line := range []string{
		`edition    = "kube"`, `plugin_dir = "/usr/local/bin"`, `dry_run    = false`,
		`leader "kubernetes" {`, `namespace = "reaper-system"`, `name      = "reaper"`, `lease     = "15s"`,
		`interval = "30s"`, `listen = ":9464"`, `substrate "kube" {`,
	} {
		if !strings.Contains(hcl, line) {
			t.Errorf("the configuration lacks %q:\n%s", line, hcl)
		}
	}
	if got := reapersIn(hcl); got != reaperOrder {
		t.Errorf("reapers %q, want %q", got, reaperOrder)
	}
	checkDSNFromSecret(t, pod, hcl, "reaper-database", "dsn")

	svc := convert[corev1.Service](t, find(t, objs, "Service", "reaper"))
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9464 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("service ports: %+v", svc.Spec.Ports)
	}
	if !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
		t.Errorf("service selector %v != deployment selector %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels)
	}
}

func TestChartTemplateCustomValuesReachEveryObject(t *testing.T) {
	objs := render(t, "reaper-system", "--values", customValues)
	want := "ClusterRole//reaper-system-reaperd-nodes ClusterRoleBinding//reaper-system-reaperd-nodes " +
		"ConfigMap/reaper-system/reaperd Deployment/reaper-system/reaperd Lease/reaper-system/reaper-leader " +
		"NetworkPolicy/reaper-system/reaperd Role/reaper-system/reaperd-leader " +
		"Role/tasks/reaperd RoleBinding/reaper-system/reaperd-leader RoleBinding/tasks/reaperd " +
		"Service/reaper-system/reaperd ServiceAccount/reaper-system/reaper-sa ServiceMonitor/reaper-system/reaperd " +
		"ValidatingAdmissionPolicy//reaper-system-reaperd-task-pods ValidatingAdmissionPolicyBinding//reaper-system-reaperd-task-pods"
	if got := kinds(objs); got != want {
		t.Fatalf("rendered objects:\n got %s\nwant %s", got, want)
	}
	// The admission policy lets the custom ServiceAccount alone make task
	// pods, in the task namespace.
	// Its Secrets are the custom database Secret and the extra volume's.
	policy := find(t, objs, "ValidatingAdmissionPolicy", "reaper-system-reaperd-task-pods")
	vars, _, _ := unstructured.NestedSlice(policy.Object, "spec", "variables")
	wantVars := map[string]string{"reaperd": `request.userInfo.username == "system:serviceaccount:reaper-system:reaper-sa"`,
		"secrets": `["reaper-db-ca","scheduler-db"]`}
	for _, v := range vars {
		m := v.(map[string]any)
		if w, ok := wantVars[m["name"].(string)]; ok {
			if m["expression"] != w {
				t.Errorf("admission policy variable %s = %v, want %s", m["name"], m["expression"], w)
			}
			delete(wantVars, m["name"].(string))
		}
	}
	if len(wantVars) != 0 {
		t.Errorf("admission policy variables %v lack %v", vars, wantVars)
	}
	binding := find(t, objs, "ValidatingAdmissionPolicyBinding", "reaper-system-reaperd-task-pods")
	if ns, _, _ := unstructured.NestedString(binding.Object, "spec", "matchResources", "namespaceSelector", "matchLabels",
		"kubernetes.io/metadata.name"); ns != "tasks" {
		t.Errorf("admission policy binding matches namespace %q, want the task namespace tasks", ns)
	}
	d := convert[appsv1.Deployment](t, find(t, objs, "Deployment", "reaperd"))
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %d", *d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if want := "registry.example/reaper@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; c.Image != want {
		t.Errorf("image = %q, want %q", c.Image, want)
	}
	if d.Spec.Template.Spec.ServiceAccountName != "reaper-sa" {
		t.Errorf("serviceAccountName = %q", d.Spec.Template.Spec.ServiceAccountName)
	}
	checkPodHardening(t, d.Spec.Template.Spec)
	checkProbes(t, c, 9500)
	if vs := d.Spec.Template.Spec.Volumes; len(vs) != 4 || vs[3].Secret == nil || vs[3].Secret.SecretName != "reaper-db-ca" {
		t.Errorf("volumes %+v, want config, state, the database's and the extra db-ca", vs)
	}
	if ms := c.VolumeMounts; len(ms) != 4 || ms[3].MountPath != "/etc/reaper-db-ca" || !ms[3].ReadOnly {
		t.Errorf("mounts %+v, want config, state, the database's and the extra db-ca", ms)
	}
	if env := c.Env; len(env) != 3 || env[2].Name != "PGCONNECT_TIMEOUT" {
		t.Errorf("env %+v, want TMPDIR, REAPER_TELEMETRY_HOST and the extra PGCONNECT_TIMEOUT", env)
	}
	if got := c.Resources.Limits.Memory().String(); got != "1Gi" {
		t.Errorf("memory limit %s", got)
	}
	for _, rb := range []string{"reaperd", "reaperd-leader"} {
		o := find(t, objs, "RoleBinding", rb)
		b := convert[rbacv1.RoleBinding](t, o)
		if len(b.Subjects) != 1 || b.Subjects[0].Name != "reaper-sa" || b.Subjects[0].Namespace != "reaper-system" {
			t.Errorf("RoleBinding %s/%s subjects %+v", o.GetNamespace(), rb, b.Subjects)
		}
	}

	hcl := configOf(t, objs, "reaperd")
	checkDSNFromSecret(t, d.Spec.Template.Spec, hcl, "scheduler-db", "url")
	for _, line := range []string{
		`dry_run    = true`, `name      = "reaper-leader"`, `lease     = "20s"`, `renew = "4s"`, `interval = "20s"`,
		`heartbeat = "10s"`, `agent_lost = "2m"`, `settling_grace = "4m"`,
		`max_attempt_credential_lifetime = "2h"`, `listen = ":9500"`,
		`namespace = "tasks"`, `qps = 20`, `burst = 40`, `warm_pool_selector = "pool in (warm)"`, `finalizer_max_age = "48h"`,
		"reaper \"podlost\" {\n  policy = \"hold\"\n}",
		"reaper \"agentlost\" {\n  dry_run = true\n}",
	} {
		if !strings.Contains(hcl, line) {
			t.Errorf("the configuration lacks %q:\n%s", line, hcl)
		}
	}
	if got := reapersIn(hcl); got != "podlost dispatchlost agentlost orphanrun" {
		t.Errorf("reapers %q, want warmworker left out", got)
	}

	sm := find(t, objs, "ServiceMonitor", "reaperd")
	if sm.GetLabels()["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v", sm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" || eps[0].(map[string]any)["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %v", eps)
	}
}

// TestChartTemplateWithThePostgresLeaderHasNoLease: leader "postgres" keeps
// its lease in the board, so the configuration names no Lease and the Role
// grants none.
func TestChartTemplateWithThePostgresLeaderHasNoLease(t *testing.T) {
	objs := render(t, "reaper-system", "--set", "config.leader.kind=postgres")
	hcl := configOf(t, objs, "reaper")
	if !strings.Contains(hcl, "leader \"postgres\" {\n  lease     = \"15s\"\n}") || strings.Contains(hcl, `"kubernetes"`) {
		t.Errorf("want leader \"postgres\" with its lease alone:\n%s", hcl)
	}
	var rules []rbacv1.PolicyRule
	for _, o := range objs {
		if o.GetKind() == "Role" {
			rules = append(rules, convert[rbacv1.Role](t, o).Rules...)
		}
	}
	if len(rules) != 2 || rules[0].Resources[0] != "pods" || rules[1].Resources[0] != "events" {
		t.Errorf("rules %+v, want the pods and events rules alone", rules)
	}
	if strings.Contains(kinds(objs), "Lease/") {
		t.Errorf("a Lease rendered for leader \"postgres\": %s", kinds(objs))
	}
}

// TestChartTemplateWithTheKubeRunnerGrantsPodCreation: the runner block
// with its kube block, and pods create in the Role, only when it is on.
func TestChartTemplateWithTheKubeRunnerGrantsPodCreation(t *testing.T) {
	objs := render(t, "reaper-system", append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1",
		"--set", "config.runner.settings.max_parallel=10", "--set", "config.runner.kube.cpu_request=250m")...)
	hcl := configOf(t, objs, "reaper")
	if want := "runner {\n  max_parallel = 10\n  kube {\n    image = \"task:1\"\n    cpu_request = \"250m\"\n  }\n}"; !strings.Contains(hcl, want) {
		t.Errorf("want\n%s\nin:\n%s", want, hcl)
	}
	role := convert[rbacv1.Role](t, find(t, objs, "Role", "reaper"))
	if got := strings.Join(role.Rules[0].Verbs, " "); got != "get list watch patch delete create" {
		t.Errorf("pods verbs %q, want create added", got)
	}
	warm := configOf(t, render(t, "reaper-system", append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1",
		"--set", "config.runner.kube.warm_pool.size=3", "--set", "config.runner.kube.warm_pool.name=etl")...), "reaper")
	if want := "  kube {\n    image = \"task:1\"\n    warm_pool {\n      name = \"etl\"\n      size = 3\n    }\n  }"; !strings.Contains(warm, want) {
		t.Errorf("want\n%s\nin:\n%s", want, warm)
	}
	out, err := helm(t, append([]string{"template", "reaper", chartDir, "--set", "config.runner.enabled=true"}, attemptAPISecrets...)...)
	if err == nil || !strings.Contains(out, "config.runner.kube.image") {
		t.Errorf("a runner without an image: %v\n%s", err, out)
	}
	if hcl := configOf(t, render(t, "ns"), "reaper"); strings.Contains(hcl, "runner") {
		t.Errorf("runner rendered while off:\n%s", hcl)
	}
}

// TestChartTemplateWithEventsOffGrantsNoEvents: config.kube.events = false
// reaches the substrate's block, and the Role drops its events rule; on
// (the default), the rule is create and patch of events.k8s.io Events in
// the task namespace.
func TestChartTemplateWithEventsOffGrantsNoEvents(t *testing.T) {
	eventsRules := func(objs []*unstructured.Unstructured) (out []string) {
		for _, o := range objs {
			if o.GetKind() != "Role" {
				continue
			}
			for _, r := range convert[rbacv1.Role](t, o).Rules {
				if slices.Contains(r.Resources, "events") {
					out = append(out, fmt.Sprintf("%s %v %v %v", o.GetNamespace(), r.APIGroups, r.Resources, r.Verbs))
				}
			}
		}
		return out
	}
	on := render(t, "reaper-system")
	if got := eventsRules(on); len(got) != 1 || got[0] != "reaper-system-tasks [events.k8s.io] [events] [create patch]" {
		t.Errorf("events rules by default %q, want create and patch in the task namespace", got)
	}
	if hcl := configOf(t, on, "reaper"); !strings.Contains(hcl, "events = true") {
		t.Errorf("events on by default not in the substrate's block:\n%s", hcl)
	}
	off := render(t, "reaper-system", "--set", "config.kube.events=false")
	if got := eventsRules(off); len(got) != 0 {
		t.Errorf("events rules with events off: %q", got)
	}
	if hcl := configOf(t, off, "reaper"); !strings.Contains(hcl, "events = false") {
		t.Errorf("events = false not in the substrate's block:\n%s", hcl)
	}
	if out, err := helm(t, "template", "reaper", chartDir, "--set", "config.kube.events=maybe"); err == nil {
		t.Errorf("events = maybe accepted:\n%s", out)
	}
}

// attemptAPISecrets are the values naming the attempt API's certificate
// and signing-key Secrets, which serving it to the cluster requires.
var attemptAPISecrets = []string{"--set", "attemptApi.tls.existingSecret=reaper-attempt-api-tls",
	"--set", "attemptApi.signingKeys.existingSecret=reaper-attempt-api-keys"}

// TestChartTemplateServesTheAttemptAPIToThePodsAtItsServiceURL: with the
// kube runner on, the attempt API listens off loopback behind a Service of
// its own, and reaperd advertises that Service's in-cluster https URL (the
// name its certificate must cover) rather than a loopback address no pod
// can reach; the certificate, the CA the agents trust and the signing keys
// come from the operator's Secrets. Off by default.
func TestChartTemplateServesTheAttemptAPIToThePodsAtItsServiceURL(t *testing.T) {
	objs := render(t, "reaper-system", append(attemptAPISecrets, "--set", "config.runner.enabled=true",
		"--set", "config.runner.kube.image=task:1", "--set", "attemptApi.tls.caKey=ca.crt")...)
	hcl := configOf(t, objs, "reaper")
	want := `attempt_api {
  listen           = ":9465"
  advertise        = "https://reaper-attempt-api.reaper-system.svc:443"
  tls_cert         = "/etc/reaper-attempt-api/tls/tls.crt"
  tls_key          = "/etc/reaper-attempt-api/tls/tls.key"
  tls_ca           = "/etc/reaper-attempt-api/tls/ca.crt"
  signing_key_file = "/etc/reaper-attempt-api/keys/keys.hcl"
}`
	if !strings.Contains(hcl, want) {
		t.Errorf("want\n%s\nin:\n%s", want, hcl)
	}
	svc := convert[corev1.Service](t, find(t, objs, "Service", "reaper-attempt-api"))
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.StrVal != "attempt-api" {
		t.Errorf("attempt API Service ports %+v, want 443 to the attempt-api port", svc.Spec.Ports)
	}
	dep := convert[appsv1.Deployment](t, find(t, objs, "Deployment", "reaper"))
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the replicas do not carry (%v)", k, v, dep.Spec.Template.Labels)
		}
	}
	c := dep.Spec.Template.Spec.Containers[0]
	port := false
	for _, p := range c.Ports {
		port = port || (p.Name == "attempt-api" && p.ContainerPort == 9465)
	}
	if !port {
		t.Errorf("container ports %+v, want attempt-api 9465", c.Ports)
	}
	secrets := map[string]string{}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for vol, want := range map[string][2]string{
		"attempt-api-tls":  {"reaper-attempt-api-tls", "/etc/reaper-attempt-api/tls"},
		"attempt-api-keys": {"reaper-attempt-api-keys", "/etc/reaper-attempt-api/keys"},
	} {
		if secrets[vol] != want[0] || mounts[vol] != want[1] {
			t.Errorf("volume %s: Secret %q at %q, want %q at %q", vol, secrets[vol], mounts[vol], want[0], want[1])
		}
	}

	// Asked for without the runner (another scheduler's pods report to it).
	hcl = configOf(t, render(t, "ns", append(attemptAPISecrets, "--set", "attemptApi.enabled=true")...), "reaper")
	if !strings.Contains(hcl, `advertise        = "https://reaper-attempt-api.ns.svc:443"`) || strings.Contains(hcl, "tls_ca") {
		t.Errorf("attempt API asked for alone:\n%s", hcl)
	}
	// Off: reaperd keeps its loopback default, no Service.
	off := render(t, "ns")
	if hcl := configOf(t, off, "reaper"); strings.Contains(hcl, "attempt_api") {
		t.Errorf("attempt_api rendered while off:\n%s", hcl)
	}
	if strings.Contains(kinds(off), "Service/ns/reaper-attempt-api") {
		t.Errorf("the attempt API Service rendered while off: %s", kinds(off))
	}
}

// TestChartTemplateRefusesTheAttemptAPIWithoutItsSecrets: off loopback the
// API needs the operator's certificate, and replicas need keys they share.
func TestChartTemplateRefusesTheAttemptAPIWithoutItsSecrets(t *testing.T) {
	for missing, set := range map[string]string{
		"attemptApi.tls.existingSecret":         "attemptApi.signingKeys.existingSecret=keys",
		"attemptApi.signingKeys.existingSecret": "attemptApi.tls.existingSecret=tls",
	} {
		out, err := helm(t, "template", "reaper", chartDir, "--set", "config.runner.enabled=true",
			"--set", "config.runner.kube.image=task:1", "--set", set)
		if err == nil || !strings.Contains(out, missing) {
			t.Errorf("the attempt API without %s: %v\n%s", missing, err, out)
		}
	}
}

func TestChartTemplateRefusesAnInstallWithoutTheDatabaseSecret(t *testing.T) {
	out, err := helm(t, "template", "reaper", chartDir, "--set", "database.existingSecret=")
	if err == nil || !strings.Contains(out, "database.existingSecret") {
		t.Fatalf("helm template without a Secret: %v\n%s", err, out)
	}
}

// TestChartValuesSchemaRefusesMisspelledAndMistypedValues: a misspelled
// reaper or ladder key would otherwise be ignored in silence (a reaper meant
// to run dry would run live), and a duration must be a string.
func TestChartValuesSchemaRefusesMisspelledAndMistypedValues(t *testing.T) {
	for _, set := range []string{
		"config.reapers.agentLost.dryRun=true",
		"config.reapers.agentlost.dry_run=true",
		"config.ladder.agentLost=2m",
		"config.ladder.agent_lost=90",
		"config.ladder.agent_lost=90 seconds",
		"config.kube.qps=-1",
		"config.reapers.podlost.sha256=abc",
		"replicaCount=0",
		"taskNamespace.allowReleasenamespace=true",
		"taskNamespace.name=Tasks_1",
		"admissionPolicy.protectedSecret=x",
	} {
		out, err := helm(t, "template", "reaper", chartDir, "--set", set)
		if err == nil || !strings.Contains(out, "values don't meet the specifications of the schema") {
			t.Errorf("--set %s: accepted (%v)\n%s", set, err, out)
		}
	}
}

// TestChartTemplateEscapesHCLTemplateSequencesInValues: a value is data in
// the HCL file, never an interpolation.
func TestChartTemplateEscapesHCLTemplateSequencesInValues(t *testing.T) {
	objs := render(t, "ns", "--set", `config.kube.warm_pool_selector=a=${b}%{c}"d`)
	hcl := configOf(t, objs, "reaper")
	if want := `warm_pool_selector = "a=$${b}%%{c}\"d"`; !strings.Contains(hcl, want) {
		t.Fatalf("want %s in:\n%s", want, hcl)
	}
}

// TestChartRBACHasTheRulesOfDeployKube: the chart's Roles and the plain
// manifest deploy/kube/rbac.yaml grant the same rules, whether the task pods
// live in a namespace of their own (the default) or, acknowledged, in the
// release's; with the kube runner, the chart adds what the manifest says the
// runner needs (create on pods, and its ClusterRole: create on tokenreviews),
// and nothing else.
func TestChartRBACHasTheRulesOfDeployKube(t *testing.T) {
	manifest, err := os.ReadFile("../kube/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []rbacv1.PolicyRule
	for _, u := range decodeAll(t, "deploy/kube/rbac.yaml", manifest) {
		if u.GetKind() == "Role" {
			want = append(want, convert[rbacv1.Role](t, u).Rules...)
		}
	}
	if len(want) == 0 {
		t.Fatal("no Role in deploy/kube/rbac.yaml")
	}
	var wantCluster, wantRunner []rbacv1.PolicyRule
	for _, u := range decodeAll(t, "deploy/kube/rbac.yaml", manifest) {
		if u.GetKind() != "ClusterRole" {
			continue
		}
		if u.GetName() == "reaperd-runner" {
			wantRunner = append(wantRunner, convert[rbacv1.ClusterRole](t, u).Rules...)
		} else {
			wantCluster = append(wantCluster, convert[rbacv1.ClusterRole](t, u).Rules...)
		}
	}
	if len(wantCluster) == 0 || len(wantRunner) == 0 {
		t.Fatal("no ClusterRole, or none for the runner, in deploy/kube/rbac.yaml")
	}
	runner := append([]string{"--set", "config.runner.enabled=true", "--set", "config.runner.kube.image=task:1"}, attemptAPISecrets...)
	// The manifest's Lease is named reaperd.
	for i, args := range [][]string{nil, {"--set", "taskNamespace.name=reaper-system", "--set", "taskNamespace.allowReleaseNamespace=true"}, runner} {
		withRunner := i == 2
		var got, gotCluster []rbacv1.PolicyRule
		for _, o := range render(t, "reaper-system", append(slices.Clone(args), "--set", "config.leader.name=reaperd")...) {
			switch o.GetKind() {
			case "Role":
				got = append(got, convert[rbacv1.Role](t, o).Rules...)
			case "ClusterRole":
				gotCluster = append(gotCluster, convert[rbacv1.ClusterRole](t, o).Rules...)
			}
		}
		wantRoles, wantClusterRoles := ruleSet(want), ruleSet(wantCluster)
		if withRunner {
			wantRoles = ruleSet(append(slices.Clone(want), rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"},
				Verbs: []string{"create"}}))
			wantClusterRoles = ruleSet(append(slices.Clone(wantCluster), wantRunner...))
		}
		if !reflect.DeepEqual(ruleSet(got), wantRoles) {
			t.Errorf("%v: chart rules %v, deploy/kube/rbac.yaml rules %v", args, ruleSet(got), wantRoles)
		}
		if !reflect.DeepEqual(ruleSet(gotCluster), wantClusterRoles) {
			t.Errorf("%v: chart cluster rules %v, deploy/kube/rbac.yaml cluster rules %v", args, ruleSet(gotCluster), wantClusterRoles)
		}
	}
}

func ruleSet(rules []rbacv1.PolicyRule) []string {
	var s []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					s = append(s, fmt.Sprintf("%s/%s/%s/%v", g, res, v, r.ResourceNames))
				}
			}
		}
	}
	sort.Strings(s)
	return s
}

// reapersIn lists the reaper blocks of an HCL file in order.
func reapersIn(hcl string) string {
	var names []string
	for _, line := range strings.Split(hcl, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, `reaper "`); ok {
			names = append(names, rest[:strings.IndexByte(rest, '"')])
		}
	}
	return strings.Join(names, " ")
}

func checkPodHardening(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want a non-root user", psc)
	}
	sc := pod.Containers[0].SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v: want a read-only root, no escalation, no capabilities", sc)
	}
	checkTelemetryOnThePodIP(t, pod.Containers[0])
	// The read-only root needs one writable directory: TMPDIR (go-plugin's
	// sockets) on the state volume.
	var tmpdir string
	for _, e := range pod.Containers[0].Env {
		if e.Name == "TMPDIR" {
			tmpdir = e.Value
		}
	}
	var mounted bool
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.MountPath == tmpdir && !m.ReadOnly {
			mounted = true
		}
	}
	if tmpdir == "" || !mounted {
		t.Errorf("TMPDIR %q is not a writable volume: %+v", tmpdir, pod.Containers[0].VolumeMounts)
	}
}

func modeOf(m *int32) string {
	if m == nil {
		return "unset"
	}
	return fmt.Sprintf("%04o", *m)
}

// dsnAttr is a store.dsn attribute: a DSN in the configuration itself.
var dsnAttr = regexp.MustCompile(`(?m)^\s*dsn\s*=`)

// checkDSNFromSecret: the DSN reaches reaperd as a file, never through
// its environment. The pod mounts the one key of the database Secret,
// read-only and mode 0440 (with the pod's fsGroup: root's file, readable by
// reaperd's group, the mode reaperd accepts for a root-owned secret), and
// the configuration names that file in store.dsn_file. No variable names
// the Secret or holds a DSN.
func checkDSNFromSecret(t *testing.T, pod corev1.PodSpec, hcl, secret, key string) {
	t.Helper()
	c := pod.Containers[0]
	for _, e := range c.Env {
		if e.Value != "" && strings.Contains(strings.ToLower(e.Value), "postgres") {
			t.Errorf("env %s holds a value in the clear: %q", e.Name, e.Value)
		}
		if e.Name == "REAPER_DSN" || e.Name == "REAPER_DSN_FILE" ||
			(e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == secret) {
			t.Errorf("env %+v: the DSN must come from the mounted file alone", e)
		}
	}
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil && e.SecretRef.Name == secret {
			t.Errorf("envFrom %+v: the DSN must come from the mounted file alone", e)
		}
	}
	var vol *corev1.Volume
	for i, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secret {
			if vol != nil {
				t.Errorf("the Secret %s is mounted twice: %+v", secret, pod.Volumes)
			}
			vol = &pod.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("no volume of the Secret %s in %+v", secret, pod.Volumes)
	}
	s := vol.Secret
	if len(s.Items) != 1 || s.Items[0].Key != key || s.Items[0].Path != key || s.Items[0].Mode != nil {
		t.Errorf("volume %s items %+v, want the key %s alone, at %s", vol.Name, s.Items, key, key)
	}
	if s.DefaultMode == nil || *s.DefaultMode != 0o440 {
		t.Errorf("volume %s defaultMode %s, want 0440: readable by the pod's fsGroup alone", vol.Name, modeOf(s.DefaultMode))
	}
	if s.Optional == nil || !*s.Optional {
		t.Errorf("volume %s is not optional: a pod whose Secret is missing would hang in ContainerCreating instead of saying, in its readiness and its log, that it waits for its DSN", vol.Name)
	}
	if sc := pod.SecurityContext; sc == nil || sc.FSGroup == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want a non-root user and an fsGroup, so that the 0440 file is root's and its group reaperd's", sc)
	}
	var dir string
	for _, m := range c.VolumeMounts {
		if m.Name == vol.Name {
			if !m.ReadOnly || m.SubPath != "" || dir != "" {
				t.Errorf("mount %+v of the DSN volume, want one read-only mount of the whole volume", m)
			}
			dir = m.MountPath
		}
	}
	if dir != "/etc/reaper-db" {
		t.Errorf("the DSN volume is mounted at %q, want /etc/reaper-db", dir)
	}
	if want := "\nstore {\n  dsn_file = \"" + dir + "/" + key + "\"\n}\n"; !strings.Contains(hcl, want) {
		t.Errorf("the configuration lacks %q:\n%s", want, hcl)
	}
	if dsnAttr.MatchString(hcl) || strings.Contains(hcl, "postgres://") {
		t.Errorf("the configuration holds a DSN:\n%s", hcl)
	}
}

// checkProbes: both probes ask /monitor/health, never /metrics (a scrape's
// work, on the telemetry server's few connections). Readiness follows its
// full answer (database and loop); liveness asks with ?probe=liveness,
// which answers from the process alone, so that a database outage or a
// long cycle never gets a leader killed mid-cycle.
func checkProbes(t *testing.T, c corev1.Container, port int32) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != port {
		t.Errorf("ports %+v, want metrics on %d", c.Ports, port)
	}
	r, l := c.ReadinessProbe, c.LivenessProbe
	if r == nil || r.HTTPGet == nil || r.HTTPGet.Path != "/monitor/health" || r.HTTPGet.Port.String() != "metrics" {
		t.Errorf("readiness probe %+v, want /monitor/health", r)
	}
	if l == nil || l.HTTPGet == nil || l.HTTPGet.Path != "/monitor/health?probe="+telemetry.ProbeLiveness || l.HTTPGet.Port.String() != "metrics" {
		t.Errorf("liveness probe %+v, want /monitor/health?probe=%s", l, telemetry.ProbeLiveness)
	}
	if l != nil && time.Duration(l.PeriodSeconds*l.FailureThreshold)*time.Second < 2*time.Minute {
		t.Errorf("liveness gives up after %ds: want at least two minutes", l.PeriodSeconds*l.FailureThreshold)
	}
}

// checkTelemetryOnThePodIP: reaperd is told the pod's IP (downward API), so
// telemetry is not served on every interface.
func checkTelemetryOnThePodIP(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "REAPER_TELEMETRY_HOST" {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
				t.Errorf("REAPER_TELEMETRY_HOST = %+v, want the downward API's status.podIP", e)
			}
			return
		}
	}
	t.Errorf("no REAPER_TELEMETRY_HOST in %+v: telemetry would listen on every interface", c.Env)
}
