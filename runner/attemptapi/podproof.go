package attemptapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// The pod proof: a bootstrap credential sits in a pod spec, which anyone
// allowed to get pods reads, while the pod may wait long before its agent
// starts (scheduling, the image pull). So the exchange of a kube
// attempt's bootstrap (and of a warm worker's) must also prove it comes
// from inside the pod the board recorded for it: the call carries, in
// HeaderPodToken, the projected ServiceAccount token the kubelet wrote
// into that pod (bound to the pod, for the API's own audience), and the
// server has the cluster review it (PodVerifier). A call without the
// proof, or with another pod's, is refused (CodeNotFromPod) and spends
// nothing: the pod's own agent exchanges the same bootstrap afterwards.

// HeaderPodToken carries the pod's projected ServiceAccount token on an
// exchange (PathExchange, PathWorkerExchange). A header, not a body field,
// so that an older server, which decodes bodies strictly, still reads the
// call.
const HeaderPodToken = "Reaper-Pod-Token"

// EnvPodTokenFile names, in the agent's environment, the file holding its
// pod's projected ServiceAccount token (the kube runner's pods set it to
// where the token volume is mounted); absent or "": no pod token (Lite).
const EnvPodTokenFile = "REAPER_POD_TOKEN_FILE"

// maxPodToken bounds the pod token file the client reads and the header
// the server accepts.
const maxPodToken = 16 << 10

// Codes of an exchange's pod proof.
const (
	// CodeNotFromPod (403) refuses an exchange that did not prove it comes
	// from the pod recorded for the attempt or the worker; nothing was
	// written and the bootstrap is not spent.
	CodeNotFromPod = sdk.LabelExchangeNotFromPod
	// CodePodNotRecorded (503) answers an exchange whose pod is not
	// recorded on the board yet (the runner records it once the create
	// answered): retry.
	CodePodNotRecorded = "pod_not_recorded"
	// CodePodUnverified (503) answers an exchange whose pod token could
	// not be reviewed (the cluster's API unreachable): retry; it is never
	// taken as proof.
	CodePodUnverified = "pod_unverified"
)

// ErrNotFromPod is wrapped by a PodVerifier's error when the token does not
// prove the pod: a refusal, not a failure to review.
var ErrNotFromPod = errors.New("the pod token does not prove the recorded pod")

// PodVerifier reviews a pod token: whether it is the projected
// ServiceAccount token of the pod whose UID is uid, issued for the attempt
// API's audience to the task ServiceAccount. It returns the pod the token
// names (as far as it names one, for the evidence) and nil when it proves
// that pod; an error wrapping ErrNotFromPod when it does not; any other
// error when the review could not be made (never an accept).
type PodVerifier interface {
	VerifyPod(ctx context.Context, token, uid string) (PodIdentity, error)
}

// PodIdentity is the pod a reviewed token names.
type PodIdentity struct {
	Namespace, ServiceAccount, PodName, PodUID string
}

// proveKubeAttempt checks the pod proof of an exchange of attempt a: on
// an attempt of executor kube, when the server has a PodVerifier. nil: the
// exchange may proceed.
func (s *Server) proveKubeAttempt(ctx context.Context, c call) error {
	if s.cfg.Pods == nil {
		return nil
	}
	a := c.req.Attempt()
	ti, err := s.cfg.Board.TaskInstance(ctx, a.RunID, a.TaskID)
	if errors.Is(err, board.ErrNotFound) {
		return nil // the exchange answers that the attempt moved on
	}
	if err != nil {
		return boardFailure("reading the attempt", err)
	}
	if ti.Attempt != a || ti.Executor != sdk.ExecutorKube {
		return nil
	}
	uid, err := s.cfg.Board.PodUID(ctx, a)
	if err != nil {
		return boardFailure("reading the attempt's pod", err)
	}
	return s.provePod(ctx, c, uid, a, map[string]string{"call": CallExchange})
}

// proveWorker checks the pod proof of a warm worker's exchange: the pod
// recorded for the worker.
func (s *Server) proveWorker(ctx context.Context, c call) error {
	if s.cfg.Pods == nil {
		return nil
	}
	uid, err := s.cfg.Board.WarmWorkerPodUID(ctx, c.worker.Worker)
	if err != nil {
		return boardFailure("reading the warm worker's pod", err)
	}
	return s.provePod(ctx, c, uid, sdk.Attempt{}, map[string]string{"call": CallWorkerExchange, "warm_worker": c.worker.Worker})
}

// provePod decides the proof given the recorded pod UID: no token is a
// refusal; a pod not recorded yet, or a review that could not be made, is
// retryable; the review's verdict otherwise. A refusal is logged and handed
// on as a decision.
func (s *Server) provePod(ctx context.Context, c call, uid string, a sdk.Attempt, ev map[string]string) error {
	ev["recorded_pod_uid"] = uid
	if c.podToken == "" {
		return s.notFromPod(ctx, a, ev, "the call carries no pod token (header "+HeaderPodToken+")")
	}
	if uid == "" {
		return refuse(http.StatusServiceUnavailable, CodePodNotRecorded,
			"the pod is not recorded on the board yet: retry")
	}
	id, err := s.cfg.Pods.VerifyPod(ctx, c.podToken, uid)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrNotFromPod) {
		// The review's error is for the log: it may name the API server
		// and carry its words.
		return &refusal{status: http.StatusServiceUnavailable, cause: err,
			body: ErrorBody{Code: CodePodUnverified, Message: "the pod token could not be reviewed; retry"}}
	}
	ev["pod_uid"], ev["pod"], ev["namespace"], ev["service_account"] = id.PodUID, id.PodName, id.Namespace, id.ServiceAccount
	return s.notFromPod(ctx, a, ev, err.Error())
}

func (s *Server) notFromPod(ctx context.Context, a sdk.Attempt, ev map[string]string, why string) error {
	ev["why"] = why
	detail := "exchange refused: " + why + "; the bootstrap credential is not spent"
	s.cfg.Logger.Warn("an exchange did not prove it comes from the recorded pod: refused", "attempt", a.String(),
		"warm_worker", ev["warm_worker"], "why", why, "recorded_pod_uid", ev["recorded_pod_uid"], "pod_uid", ev["pod_uid"])
	if s.cfg.Decisions != nil {
		s.cfg.Decisions(ctx, []sdk.Decision{{Reaper: DecisionSource, Label: sdk.LabelExchangeNotFromPod, Attempt: a,
			Detail: detail, Evidence: ev}})
	}
	return refuse(http.StatusForbidden, CodeNotFromPod, "%s", why)
}

// readPodToken reads the pod token file at path ("", or no such file:
// none, and the API judges the exchange without it; a kube pod's kubelet
// writes the file before the container starts).
func readPodToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the pod token: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPodToken+1))
	if err != nil {
		return "", fmt.Errorf("reading the pod token %s: %w", path, err)
	}
	if len(b) > maxPodToken {
		return "", fmt.Errorf("the pod token %s is over %d bytes", path, maxPodToken)
	}
	return strings.TrimSpace(string(b)), nil
}
