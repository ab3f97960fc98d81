package literunner

import (
	"errors"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/runner/internal/steps"
)

// spawnMove is what a failed spawn calls for (steps.DispatchMove).
type spawnMove = steps.DispatchMove

const (
	// spawnFail: the error will not pass by itself (no agent binary, a
	// refused record directory, a bad invocation): dispatch_failed now.
	spawnFail = steps.DispatchFail
	// spawnOfferAgain: a passing shortage: the dispatch-failure backoff rail
	// (epoch+1, back to scheduled), offered again next cycle.
	spawnOfferAgain = steps.DispatchOfferAgain
	// spawnExhausted: a passing shortage that has lasted the whole window:
	// dispatch_failed.
	spawnExhausted = steps.DispatchExhausted
)

// passing reports whether err is one that a later attempt to start an
// agent may not meet: the host ran short of processes, memory, descriptors
// or disk, a call was interrupted, or the agent binary is being replaced at
// this moment.
func passing(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE,
		syscall.ENOSPC, syscall.EDQUOT, syscall.EINTR, syscall.ETXTBSY:
		return true
	}
	return false
}

// decideSpawnFailure judges a failed spawn, in the spirit of the
// specification's pod create errors (see steps.DecideDispatchFailure): a
// passing shortage is offered again for window, any other error fails at
// once.
func decideSpawnFailure(err error, unavailableSince, now time.Time, window time.Duration) spawnMove {
	return steps.DecideDispatchFailure(passing(err), unavailableSince, now, window)
}
