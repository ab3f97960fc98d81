// Package podproof is the attempt API's pod proof in the kube edition
// (attemptapi.PodVerifier): the projected ServiceAccount token an agent
// presents with its bootstrap exchange is reviewed by the cluster
// (TokenReview), and the answer must name the task ServiceAccount and the
// very pod the board recorded (Judge).
package podproof

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dexaflow/reaper/runner/attemptapi"
)

const (
	// ServiceAccountDefault is the task ServiceAccount: the identity of
	// the kube runner's pods in their namespace, bound to no role.
	ServiceAccountDefault = "reaper-task"
	// AudienceDefault is the audience of the pods' projected token: the
	// attempt API's own, never the API server's.
	AudienceDefault = "reaper-attempt-api"
	// TimeoutDefault bounds one TokenReview.
	TimeoutDefault = 10 * time.Second
)

// Verifier is the attempt API's pod proof in the kube edition
// (attemptapi.PodVerifier): a TokenReview of the token for Audience, whose
// answer must name the task ServiceAccount of Namespace and the recorded
// pod (Judge).
type Verifier struct {
	// Client makes the TokenReviews (reaperd's: create on tokenreviews).
	Client kubernetes.Interface
	// Namespace and ServiceAccount are the task pods'.
	Namespace, ServiceAccount string
	// Audience is the pods' token audience.
	Audience string
	// Timeout bounds one review. Default TimeoutDefault.
	Timeout time.Duration
}

var _ attemptapi.PodVerifier = Verifier{}

// VerifyPod reviews token (see attemptapi.PodVerifier). A review the API
// server did not answer is an error of its own, never an accept.
func (v Verifier) VerifyPod(ctx context.Context, token, uid string) (attemptapi.PodIdentity, error) {
	timeout := v.Timeout
	if timeout <= 0 {
		timeout = TimeoutDefault
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr, err := v.Client.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{v.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return attemptapi.PodIdentity{}, fmt.Errorf("token review: %w", err)
	}
	return Judge(tr.Status, Expected{Namespace: v.Namespace, ServiceAccount: v.ServiceAccount,
		Audience: v.Audience, PodUID: uid})
}

// Expected is what a pod token's review must show.
type Expected struct {
	Namespace, ServiceAccount, Audience string
	// PodUID is the UID the board recorded for the attempt or the worker.
	PodUID string
}

// The user.extra keys of a ServiceAccount token bound to a pod.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Judge is the decision of a TokenReview's answer st against
// want: nil when the token proves the recorded pod, else an error wrapping
// attemptapi.ErrNotFromPod that says why. The identity is what the token
// names, as far as it names anything. In order: the token must be
// authenticated, for want.Audience, as the ServiceAccount want names
// (system:serviceaccount:<namespace>:<name>), bound to a pod (a token
// made without one names none), and that pod's UID must be want.PodUID.
func Judge(st authv1.TokenReviewStatus, want Expected) (attemptapi.PodIdentity, error) {
	id := attemptapi.PodIdentity{PodName: one(st.User.Extra[extraPodName]), PodUID: one(st.User.Extra[extraPodUID])}
	if ns, sa, ok := serviceAccountOf(st.User.Username); ok {
		id.Namespace, id.ServiceAccount = ns, sa
	}
	refuse := func(format string, args ...any) (attemptapi.PodIdentity, error) {
		return id, fmt.Errorf("%w: %s", attemptapi.ErrNotFromPod, fmt.Sprintf(format, args...))
	}
	switch {
	case !st.Authenticated:
		return refuse("the cluster does not authenticate the pod token for audience %q: %s", want.Audience, st.Error)
	case !slices.Contains(st.Audiences, want.Audience):
		return refuse("the pod token is for audiences %q, not %q", st.Audiences, want.Audience)
	case id.Namespace != want.Namespace || id.ServiceAccount != want.ServiceAccount:
		return refuse("the pod token is %q's, not the task ServiceAccount %s/%s", st.User.Username,
			want.Namespace, want.ServiceAccount)
	case id.PodUID == "":
		return refuse("the pod token is bound to no pod")
	case want.PodUID == "" || id.PodUID != want.PodUID:
		return refuse("the pod token is pod %s's (uid %s), the board records pod uid %s", id.PodName, id.PodUID, want.PodUID)
	}
	return id, nil
}

// serviceAccountOf splits a ServiceAccount's user name.
func serviceAccountOf(user string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != ""
}

// one is the single value of an extra, "" when there is not exactly one.
func one(vs authv1.ExtraValue) string {
	if len(vs) != 1 {
		return ""
	}
	return vs[0]
}
