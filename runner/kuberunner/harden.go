package kuberunner

import (
	corev1 "k8s.io/api/core/v1"
)

// The hardening of every pod the runner makes (task pods and warm
// workers): their container runs user code next to the agent, so it gets
// no more than it needs. No service-account token is mounted (a task has
// no business with the API server); the pod and its container run as a
// non-root user (RunAsUser, RunAsGroup), without privilege escalation,
// with every capability dropped (so neither the task nor the agent has
// CAP_SYS_PTRACE, and the agent's non-dumpable flag keeps its credential
// from the task) and the runtime's default seccomp profile. The root
// filesystem is read-only unless the configuration says the image needs
// it writable; an emptyDir at TmpDir is then the container's scratch
// space: the agent's record directory lives there ($TMPDIR), and tasks
// may write there. The outcome record's file is the kubelet's, outside
// the root filesystem.
const (
	// RunAsDefault is the default user and group id of the runner's pods:
	// non-root, the "nonroot" user of distroless images.
	RunAsDefault int64 = 65532
	// TmpVolume is the name of the writable scratch volume, mounted at
	// TmpDir.
	TmpVolume = "tmp"
	// TmpDir is where the scratch volume is mounted, and the container's
	// TMPDIR.
	TmpDir = "/tmp"
)

// Hardening is what the configuration says of the runner's pods' security
// context.
type Hardening struct {
	// RunAsUser and RunAsGroup: the container's uid and gid. Default
	// RunAsDefault; never 0.
	RunAsUser, RunAsGroup int64
	// WritableRoot leaves the root filesystem writable (an image whose
	// tasks write outside TmpDir); default read-only.
	WritableRoot bool
}

// harden applies h to pod, whose only container is c (an element of
// pod.Spec.Containers).
func harden(h Hardening, pod *corev1.Pod, c *corev1.Container) {
	no, yes := false, true
	uid, gid := h.RunAsUser, h.RunAsGroup
	if uid <= 0 {
		uid = RunAsDefault
	}
	if gid <= 0 {
		gid = RunAsDefault
	}
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	pod.Spec.AutomountServiceAccountToken = &no
	// The pod's sandbox (pause) process is its PID 1, not the agent: an
	// agent as PID 1 would owe init's duties (reaping every orphan of its
	// task) and the group record refuses a PID of 1 by design.
	pod.Spec.ShareProcessNamespace = &yes
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &gid, SeccompProfile: seccomp,
	}
	readOnly := !h.WritableRoot
	c.SecurityContext = &corev1.SecurityContext{
		RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &gid,
		Privileged: &no, AllowPrivilegeEscalation: &no,
		Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem: &readOnly,
		SeccompProfile:         seccomp,
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: TmpVolume,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: TmpVolume, MountPath: TmpDir})
	c.Env = append(c.Env, corev1.EnvVar{Name: "TMPDIR", Value: TmpDir})
}
