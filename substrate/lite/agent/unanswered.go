package agent

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControlPlaneUnanswered reports whether err is an answer that never came:
// it carries the gRPC code Unavailable, DeadlineExceeded, Aborted or
// Internal (the last from an older control plane). A refusal
// (PermissionDenied, Unauthenticated, NotFound, ...) is an answer, and so
// is an error with no gRPC code at all: a reporter whose transport is not
// gRPC says which of its failures went unanswered by giving them one of
// these codes.
func ControlPlaneUnanswered(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if err == nil || !errors.As(err, &se) {
		return false
	}
	switch se.GRPCStatus().Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Internal:
		return true
	}
	return false
}
