package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodTokenEnv tells the process where its projected ServiceAccount token
// is (the agent's pod token variable, which the kube runner sets to the
// volume's mount path): the player writes the token into the container's
// directory and replaces the variable's value with that file.
const PodTokenEnv = "REAPER_POD_TOKEN_FILE"

// projectTokens does for the container spec what a kubelet does for a
// projected volume's serviceAccountToken sources mounted in it: a
// TokenRequest for the pod's ServiceAccount, bound to the pod (its name
// and UID), with the source's audience and expiry, written into the
// container's directory (dir/<volume>/<path>). It returns the file of the
// last token written ("" when the container mounts none). A token the API
// server refuses (the ServiceAccount missing, say) fails the start, as a
// kubelet leaves such a pod short of running. The token is not renewed:
// a test's pod lives far less than its expiry.
func (p *Player) projectTokens(ctx context.Context, pod *corev1.Pod, spec corev1.Container, dir string) (string, error) {
	mounted := map[string]bool{}
	for _, m := range spec.VolumeMounts {
		mounted[m.Name] = true
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	var file string
	for _, v := range pod.Spec.Volumes {
		if !mounted[v.Name] || v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			st := src.ServiceAccountToken
			if st == nil {
				continue
			}
			tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
				ExpirationSeconds: st.ExpirationSeconds,
				BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
			}}
			if st.Audience != "" {
				tr.Spec.Audiences = []string{st.Audience}
			}
			got, err := p.cfg.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
			if err != nil {
				return "", fmt.Errorf("projected volume %s: a token of ServiceAccount %s/%s: %w", v.Name, pod.Namespace, sa, err)
			}
			file = filepath.Join(dir, v.Name, st.Path)
			if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
				return "", fmt.Errorf("projected volume %s: %w", v.Name, err)
			}
			if err := os.WriteFile(file, []byte(got.Status.Token), 0o600); err != nil {
				return "", fmt.Errorf("projected volume %s: %w", v.Name, err)
			}
		}
	}
	return file, nil
}
