package kube

import (
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dexaflow/reaper/sdk"
)

// ErrNotInCluster is RESTConfig's refusal of an empty kubeconfig outside a
// pod: there is no service account to reach the API server with.
var ErrNotInCluster = errors.New("no kubeconfig set and not running in a pod")

// RESTConfig is how to reach the API server: from the kubeconfig file at
// path, or, when path is empty, through the pod's service account. Every
// part of reaper that talks to a cluster (this substrate, the kube runner,
// the Kubernetes leader lease) reads its kubeconfig setting this one way.
func RESTConfig(path string) (*rest.Config, error) {
	if path != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("loading the API server's configuration from %s: %w", path, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, ErrNotInCluster
	}
	if err != nil {
		return nil, fmt.Errorf("loading the API server's configuration from the service account: %w", err)
	}
	return rc, nil
}

// NewClient is an API client of RESTConfig(path) that names itself
// component (and the build's version) to the API server and keeps to qps
// requests a second with bursts of burst; qps 0 leaves client-go's own
// rate.
func NewClient(path, component string, qps float32, burst int) (kubernetes.Interface, error) {
	rc, err := RESTConfig(path)
	if err != nil {
		return nil, err
	}
	return newClient(rc, component, qps, burst)
}

func newClient(rc *rest.Config, component string, qps float32, burst int) (kubernetes.Interface, error) {
	if qps > 0 {
		rc.QPS, rc.Burst = qps, burst
	}
	rc.UserAgent = component + "/" + sdk.BuildVersion
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return cs, nil
}
