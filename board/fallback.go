package board

import (
	"context"

	"github.com/dexaflow/reaper/sdk"
)

// rowByRow writes reqs as one batch with write; when PostgreSQL refuses
// the batch for the data of a row (IsRowError), it writes each request
// alone, so that one poisoned request never fails the others. Each write
// alone keeps every guard of the batch statement (it is the same
// statement). A request refused alone too is answered NoopRowRefused and
// told to obs; the others are answered as their guards say.
//
// An error other than a row's (the database gone part way) ends the
// fallback with that error; the requests written alone before it stay
// written, as any write the caller's error hides: the audit's sweep of
// unaudited writes (UnauditedMarks) finds what a reaper or the reconciler
// wrote.
func rowByRow[T any](ctx context.Context, obs Observer, what string, reqs []T, attempt func(T) sdk.Attempt,
	write func(context.Context, []T) ([]sdk.MarkResult, error)) ([]sdk.MarkResult, error) {
	res, err := write(ctx, reqs)
	if err == nil || !IsRowError(err) {
		return res, err
	}
	out := make([]sdk.MarkResult, len(reqs))
	for i := range reqs {
		one, err := write(ctx, reqs[i:i+1])
		switch {
		case err == nil && len(one) == 1:
			out[i] = one[0]
		case err == nil:
			out[i] = sdk.MarkResult{Attempt: attempt(reqs[i]), NoopReason: sdk.NoopNotFound}
		case IsRowError(err):
			out[i] = sdk.MarkResult{Attempt: attempt(reqs[i]), NoopReason: sdk.NoopRowRefused}
			if obs != nil {
				obs.RowRefused(what, attempt(reqs[i]), err)
			}
		default:
			return nil, err
		}
	}
	return out, nil
}
