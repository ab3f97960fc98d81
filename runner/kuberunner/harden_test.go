package kuberunner_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

// workerEnv gives a warm worker pod a stand-in credential.
type workerEnv struct{}

func (workerEnv) WorkerEnv(_ context.Context, worker string, _ time.Time) ([]corev1.EnvVar, error) {
	return []corev1.EnvVar{{Name: "REAPER_WORKER_TOKEN", Value: "token-of-" + worker}}, nil
}

// checkHardened fails t unless the pod, as the API server stored it, runs
// its one container with the runner's hardening: no service-account token
// mounted, non-root as uid:gid, no privilege escalation, every capability
// dropped, the runtime's default seccomp profile, the root filesystem
// read-only (unless writable) and a writable emptyDir at /tmp that is the
// container's TMPDIR.
func checkHardened(t *testing.T, p *corev1.Pod, uid, gid int64, readOnly bool) {
	t.Helper()
	spec := p.Spec
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
		t.Errorf("%s: shareProcessNamespace %v, want true (the agent must not be the pod's PID 1)", p.Name, spec.ShareProcessNamespace)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken %v, want false", p.Name, spec.AutomountServiceAccountToken)
	}
	// The one projected volume is the pod token: a ServiceAccount token for
	// the attempt API's audience alone, good for nothing at the API server.
	for _, v := range spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access") {
			t.Errorf("%s: volume %s: the API server's service-account token is mounted", p.Name, v.Name)
		}
		if v.Projected != nil && !isPodToken(v) {
			t.Errorf("%s: volume %s: projected %+v, want only the pod token's", p.Name, v.Name, v.Projected.Sources)
		}
	}
	if spec.ServiceAccountName != kuberunner.ServiceAccountDefault {
		t.Errorf("%s: serviceAccountName %q, want the task ServiceAccount %q", p.Name, spec.ServiceAccountName,
			kuberunner.ServiceAccountDefault)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != uid ||
		psc.RunAsGroup == nil || *psc.RunAsGroup != gid || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod securityContext %+v, want non-root %d:%d with seccomp RuntimeDefault", p.Name, psc, uid, gid)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers", p.Name, len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("%s: container %s has no securityContext", p.Name, c.Name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != uid ||
		sc.RunAsGroup == nil || *sc.RunAsGroup != gid:
		t.Errorf("%s: container runs as %v:%v (non-root %v), want %d:%d", p.Name, sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot, uid, gid)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged:
		t.Errorf("%s: allowPrivilegeEscalation %v, privileged %v: want false, false", p.Name, sc.AllowPrivilegeEscalation, sc.Privileged)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Errorf("%s: capabilities %+v, want every one dropped and none added", p.Name, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: container seccomp %+v, want RuntimeDefault", p.Name, sc.SeccompProfile)
	case sc.ReadOnlyRootFilesystem == nil || *sc.ReadOnlyRootFilesystem != readOnly:
		t.Errorf("%s: readOnlyRootFilesystem %v, want %v", p.Name, sc.ReadOnlyRootFilesystem, readOnly)
	}
	tmp := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == kuberunner.TmpVolume && v.EmptyDir != nil })
	mount := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == kuberunner.TmpVolume && m.MountPath == kuberunner.TmpDir && !m.ReadOnly
	})
	env := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "TMPDIR" && e.Value == kuberunner.TmpDir })
	if tmp < 0 || mount < 0 || env < 0 {
		t.Errorf("%s: scratch emptyDir %d, its mount at %s %d, TMPDIR %d: want all three", p.Name, tmp, kuberunner.TmpDir, mount, env)
	}
	token := slices.IndexFunc(spec.Volumes, isPodToken)
	tokenMount := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == kuberunner.PodTokenVolume && m.MountPath == kuberunner.PodTokenDir && m.ReadOnly
	})
	tokenEnv := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == attemptapi.EnvPodTokenFile && e.Value == kuberunner.PodTokenPath
	})
	if token < 0 || tokenMount < 0 || tokenEnv < 0 {
		t.Errorf("%s: pod token volume %d, its read-only mount at %s %d, %s %d: want all three", p.Name, token,
			kuberunner.PodTokenDir, tokenMount, attemptapi.EnvPodTokenFile, tokenEnv)
	}
}

// isPodToken: v is the pod token's volume: one projected ServiceAccount
// token for the attempt API's default audience, lasting at least the API
// server's floor of 10 minutes.
func isPodToken(v corev1.Volume) bool {
	if v.Name != kuberunner.PodTokenVolume || v.Projected == nil || len(v.Projected.Sources) != 1 {
		return false
	}
	st := v.Projected.Sources[0].ServiceAccountToken
	return st != nil && st.Audience == kuberunner.TokenAudienceDefault && st.ExpirationSeconds != nil &&
		*st.ExpirationSeconds >= 600 && st.Path == "token"
}

// TestPodsTheRunnerMakesAreHardened: the task pods and warm worker pods the
// runner creates carry, as the real API server stores them, the security
// context that keeps a task from its agent's credential and from the
// cluster: non-root (the default uid and gid 65532, or the configured
// ones), no capabilities, no privilege escalation, seccomp RuntimeDefault,
// a read-only root with a writable /tmp, no token for the API server (only
// the pod token, for the attempt API's audience, as the task
// ServiceAccount); the
// API server's Pod Security admission admits them at its restricted level.
// (KWOK enforces none of it at run time; the warm end-to-end tests run
// such pods with the kubelet player.)
func TestPodsTheRunnerMakesAreHardened(t *testing.T) {
	ctx := context.Background()
	t.Run("TaskPodsAndWarmWorkersRunAsNonRootWithNoCapabilityAndNoServiceAccountToken", func(t *testing.T) {
		e := newEnv(t)
		// The API server's own Pod Security admission at its restricted
		// level: it refuses any pod short of the hardening (the control
		// below), so the runner's creates passing it prove the spec.
		ns, err := e.cs.CoreV1().Namespaces().Get(ctx, e.ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		if _, err := e.cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: e.ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/x"}}}}
		if _, err := e.cs.CoreV1().Pods(e.ns).Create(ctx, bare, metav1.CreateOptions{}); err == nil ||
			!strings.Contains(err.Error(), "PodSecurity") {
			t.Fatalf("a pod without a security context: %v, want refused by the restricted Pod Security level", err)
		}
		e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t", ExecutionTimeout: time.Minute})
		cfg := e.config(e.cs)
		cfg.Credentials = credentials{}
		cfg.WarmPool = &kuberunner.WarmPool{Size: 1, Credentials: workerEnv{}}
		r := e.runner(t, cfg)
		if res := cycle(t, r, e.clk.Now()); res.Dispatched != 1 {
			t.Fatalf("dispatched %d, want 1", res.Dispatched)
		}
		p, ok := e.pods(t)[sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}]
		if !ok {
			t.Fatal("no task pod")
		}
		checkHardened(t, &p, kuberunner.RunAsDefault, kuberunner.RunAsDefault, true)
		if _, err := r.Refill(ctx, e.clk.Now()); err != nil {
			t.Fatal(err)
		}
		list, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelWarmPool})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("warm workers %d (%v), want 1", len(list.Items), err)
		}
		checkHardened(t, &list.Items[0], kuberunner.RunAsDefault, kuberunner.RunAsDefault, true)
	})
	t.Run("ConfiguredUserAndWritableRootAreCarried", func(t *testing.T) {
		e := newEnv(t)
		e.mkRun(t, "run-1", lifecycle.NewTask{TaskID: "t"})
		cfg := e.config(e.cs)
		cfg.Hardening = kuberunner.Hardening{RunAsUser: 1000, RunAsGroup: 3000, WritableRoot: true}
		if res := cycle(t, e.runner(t, cfg), e.clk.Now()); res.Dispatched != 1 {
			t.Fatalf("dispatched %d, want 1", res.Dispatched)
		}
		p := e.pods(t)[sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}]
		checkHardened(t, &p, 1000, 3000, false)
	})
	t.Run("RootIsRefused", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config(e.cs)
		cfg.Hardening = kuberunner.Hardening{RunAsUser: -1}
		if _, err := kuberunner.New(cfg, e.w); err == nil || !strings.Contains(err.Error(), "non-root") {
			t.Fatalf("a negative run-as user: %v, want refused", err)
		}
	})
}
