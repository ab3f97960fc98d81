package helmrelease

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaSelector selects the release's reaperd pods.
const ReplicaSelector = "app.kubernetes.io/name=reaper,app.kubernetes.io/instance=" + Name

// Replicas lists the release's reaperd pods.
func (r *Release) Replicas(ctx context.Context) ([]corev1.Pod, error) {
	list, err := r.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: ReplicaSelector})
	if err != nil {
		return nil, fmt.Errorf("helmrelease: list reaperd's pods: %w", err)
	}
	return list.Items, nil
}

// Ready reports whether the pod's Ready condition is true.
func Ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitReplicasReady waits for the Deployment's two replicas to be Ready (a
// deleted pod replaced, a killed container restarted).
func (r *Release) WaitReplicasReady(ctx context.Context) error {
	return until(ctx, 3*time.Minute, 250*time.Millisecond, "the two replicas to be Ready", func() bool {
		pods, err := r.Replicas(ctx)
		n := 0
		for _, p := range pods {
			if p.DeletionTimestamp == nil && Ready(p) {
				n++
			}
		}
		return err == nil && n == 2
	})
}

// LeaseHolder is the holder of the release's Lease ("" when none).
func (r *Release) LeaseHolder(ctx context.Context) (string, error) {
	l, err := r.Client.CoordinationV1().Leases(Namespace).Get(ctx, Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("helmrelease: get the Lease: %w", err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// Leading returns the live replica that holds the Lease now and the
// identity it holds it with (a replica's identity begins with its pod's
// name); a zero pod when none does.
func (r *Release) Leading(ctx context.Context) (corev1.Pod, string, error) {
	h, err := r.LeaseHolder(ctx)
	if err != nil || h == "" {
		return corev1.Pod{}, h, err
	}
	pods, err := r.Replicas(ctx)
	if err != nil {
		return corev1.Pod{}, h, err
	}
	for _, p := range pods {
		if strings.HasPrefix(h, p.Name) && p.DeletionTimestamp == nil {
			return p, h, nil
		}
	}
	return corev1.Pod{}, h, nil
}

// Leader waits for a live replica to hold the Lease with an identity other
// than not, and returns it and that identity.
func (r *Release) Leader(ctx context.Context, not string) (corev1.Pod, string, error) {
	var pod corev1.Pod
	var holder string
	err := until(ctx, 2*time.Minute, 200*time.Millisecond, "a replica to hold the Lease", func() bool {
		var err error
		pod, holder, err = r.Leading(ctx)
		return err == nil && pod.Name != "" && holder != not
	})
	return pod, holder, err
}

// Images lists the image of each live replica.
func (r *Release) Images(ctx context.Context) ([]string, error) {
	pods, err := r.Replicas(ctx)
	var out []string
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Spec.Containers[0].Image)
		}
	}
	return out, err
}

// WaitImages waits until both live replicas run image.
func (r *Release) WaitImages(ctx context.Context, image string) error {
	return until(ctx, 3*time.Minute, 250*time.Millisecond, "both replicas on "+image, func() bool {
		imgs, err := r.Images(ctx)
		if err != nil || len(imgs) != 2 {
			return false
		}
		for _, i := range imgs {
			if i != image {
				return false
			}
		}
		return true
	})
}

// Metric reads one unlabelled metric of the replica at ip from its
// telemetry port ("" when it has none).
func Metric(ctx context.Context, ip, name string) (string, error) {
	_, body, err := telemetry(ctx, ip, "/metrics", 4<<20)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", nil
}

// Health is what the replica at ip answers its readiness probe:
// "<status> <body>", or the error that kept it from answering.
func Health(ctx context.Context, ip string) string {
	code, body, err := telemetry(ctx, ip, "/monitor/health", 1<<16)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d %s", code, body)
}

// telemetry GETs path from the replica's telemetry port on its pod
// address (the machine routes to the pod network).
func telemetry(ctx context.Context, ip, path string, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, TelemetryPort)+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("helmrelease: GET %s from %s: %w", path, ip, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, nil, fmt.Errorf("helmrelease: GET %s from %s: %w", path, ip, err)
	}
	return resp.StatusCode, body, nil
}
