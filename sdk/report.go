package sdk

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	pb "github.com/dexaflow/reaper/sdk/proto/reaperv1"
)

// Report hands decisions of the pass in flight to the host before the pass
// ends. A reaper that drains a large backlog may report each page's
// decisions as it goes: the host receives them while the pass goes on
// rather than all at its end, and keeps them even if the pass then fails.
// Reported decisions belong to the pass as if returned in its PassResult,
// and must not be returned again.
//
// Report returns false, and takes nothing, when ctx is not the context of a
// pass served over the plugin protocol (an in-process reaper, a test): the
// reaper then returns the decisions in its PassResult as usual. Report
// keeps ds and encodes it later, while the pass goes on: neither the
// decisions nor their evidence maps may change once reported.
func Report(ctx context.Context, ds []Decision) bool {
	r, ok := ctx.Value(reporterKey{}).(*reporter)
	if !ok {
		return false
	}
	return r.report(ds)
}

type reporterKey struct{}

func withReporter(ctx context.Context, r *reporter) context.Context {
	return context.WithValue(ctx, reporterKey{}, r)
}

// reporter encodes and sends reported decisions on a pass's stream from a
// goroutine of its own, so that this work overlaps the pass's calls to the
// host. It lives for one pass: close stops it.
type reporter struct {
	stream grpc.ServerStreamingServer[pb.PassResponse]
	queue  chan []Decision
	done   chan struct{}
	err    error // the first send error; read after done

	mu     sync.Mutex
	closed bool
}

func newReporter(stream grpc.ServerStreamingServer[pb.PassResponse]) *reporter {
	r := &reporter{stream: stream, queue: make(chan []Decision, 8), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *reporter) run() {
	defer close(r.done)
	for ds := range r.queue {
		if r.err == nil {
			r.err = r.stream.Send(&pb.PassResponse{Decisions: decisionsToPB(ds)})
		}
	}
}

func (r *reporter) report(ds []Decision) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for len(ds) > 0 {
		n := min(len(ds), passChunk)
		r.queue <- ds[:n]
		ds = ds[n:]
	}
	return true
}

// close waits for what was reported to be sent and returns the first send
// error. Report after close takes nothing.
func (r *reporter) close() error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	<-r.done
	return r.err
}
