package kuberunner

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/kuberunner/podproof"
	"github.com/dexaflow/reaper/substrate/kube"
)

// The pod token: every pod the runner makes (task pods and warm workers)
// runs as the task ServiceAccount (ServiceAccountDefault unless configured;
// it holds no RBAC at all) with automountServiceAccountToken false, and
// gets one projected volume holding nothing but a ServiceAccount token for
// the attempt API's audience (TokenAudienceDefault unless configured),
// which the kubelet binds to the pod and renews. The agent presents it
// with its bootstrap exchange (EnvPodTokenFile names the file), and the
// attempt API has the cluster review it (PodVerifier): the token names the
// pod's UID, which must be the one the runner recorded. A viewer who reads
// the bootstrap from the pod spec has no such token, so its exchange is
// refused and spends nothing. The token is good for nothing else: its
// audience is the attempt API's, not the API server's.
const (
	// ServiceAccountDefault is the task ServiceAccount: the pods' identity
	// in their namespace, bound to no role.
	ServiceAccountDefault = podproof.ServiceAccountDefault
	// TokenAudienceDefault is the audience of the pods' projected token:
	// the attempt API's own.
	TokenAudienceDefault = podproof.AudienceDefault
	// PodTokenVolume is the name of the projected token volume.
	PodTokenVolume = "reaper-pod-token"
	// PodTokenDir is where it is mounted (read-only); the token is the
	// file PodTokenPath.
	PodTokenDir  = "/var/run/secrets/reaper/attempt-api"
	PodTokenPath = PodTokenDir + "/token"
	// PodTokenExpiry is the projected token's expirationSeconds (the
	// kubelet renews it at 80% of that; the API server's floor is 600).
	PodTokenExpiry int64 = 3600
)

// projectPodToken gives pod, whose one container is c, the projected token
// volume for audience, its read-only mount and the variable naming the
// file to the agent. A pod that names no ServiceAccount runs as
// ServiceAccountDefault (the API server refuses a projected token without
// one), and an empty audience is TokenAudienceDefault.
func projectPodToken(pod *corev1.Pod, c *corev1.Container, audience string) {
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = ServiceAccountDefault
	}
	if audience == "" {
		audience = TokenAudienceDefault
	}
	expiry := PodTokenExpiry
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: PodTokenVolume,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: audience, ExpirationSeconds: &expiry, Path: "token",
			}}},
		}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: PodTokenVolume, MountPath: PodTokenDir, ReadOnly: true})
	c.Env = append(c.Env, corev1.EnvVar{Name: attemptapi.EnvPodTokenFile, Value: PodTokenPath})
}

// NewPodVerifier is the attempt API's pod proof of the runner's kube block
// s: TokenReviews for its pods' audience, of its namespace's task
// ServiceAccount (its client from s.Kubeconfig unless client is given).
func NewPodVerifier(s Settings, client kubernetes.Interface) (podproof.Verifier, error) {
	if client == nil {
		c, err := kube.NewClient(s.Kubeconfig, "reaperd-attempt-api", kube.QPSDefault, kube.BurstDefault)
		if err != nil {
			return podproof.Verifier{}, fmt.Errorf("attempt api pod proof: %w", err)
		}
		client = c
	}
	v := podproof.Verifier{Client: client, Namespace: s.Namespace, ServiceAccount: s.ServiceAccount, Audience: s.PodTokenAudience}
	if v.ServiceAccount == "" {
		v.ServiceAccount = ServiceAccountDefault
	}
	if v.Audience == "" {
		v.Audience = TokenAudienceDefault
	}
	if v.Namespace == "" {
		return podproof.Verifier{}, fmt.Errorf("attempt api pod proof: no task namespace")
	}
	return v, nil
}
