package kuberunner

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Unavailable reports whether a pod create error says the API server could
// not be reached or could not serve the request right now, so the same
// create may succeed later:
//
//   - an answer with status 429 (too many requests: API priority and
//     fairness, or a server shedding load) or any 5xx status: 500 internal
//     error, 502, 503 service unavailable, 504 and the server's own
//     timeout (a webhook that could not be called is answered 500 too);
//   - no answer at all: connection refused or reset, an EOF or a broken
//     connection, a network timeout (net.Error), an unreachable network
//     or host, an address that did not resolve, or the request's own
//     deadline (context.DeadlineExceeded from the client's timeout).
//
// Every other error is a refusal and false: an answer that judges the pod
// itself or the caller's right to create it (400, 401, 403 forbidden
// including an exhausted quota, 404 no such namespace, 409, 422 invalid),
// and any error this function does not recognise. A create refused will be
// refused again, so it fails the dispatch at once; a caller whose own
// context was cancelled must check that first (a cancelled create is no
// verdict on the dispatch).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == 429 || code >= 500
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	if utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) {
		return true
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ETIMEDOUT} {
		if errors.Is(err, e) {
			return true
		}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
