package plugin

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// streamSink is the sdk.Sink of a pass served over the plugin protocol. It
// encodes and sends recorded decisions on the pass's stream from a
// goroutine of its own, so that this work overlaps the pass's calls to the
// host. It lives for one pass: close stops it.
type streamSink struct {
	stream grpc.ServerStreamingServer[pb.PassResponse]
	queue  chan []sdk.Decision
	done   chan struct{}
	err    error // the first send error; read after done

	mu     sync.Mutex
	closed bool
}

var _ sdk.Sink = (*streamSink)(nil)

var errPassOver = errors.New("the pass is over: its decisions were sent")

func newStreamSink(stream grpc.ServerStreamingServer[pb.PassResponse]) *streamSink {
	s := &streamSink{stream: stream, queue: make(chan []sdk.Decision, 8), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *streamSink) run() {
	defer close(s.done)
	for ds := range s.queue {
		if s.err == nil {
			s.err = s.stream.Send(&pb.PassResponse{Decisions: decisionsToPB(ds)})
		}
	}
}

// Record queues ds to be sent, a chunk per message. It blocks while the
// queue is full, so a pass cannot run ahead of its stream without bound.
func (s *streamSink) Record(ctx context.Context, ds []sdk.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errPassOver
	}
	for len(ds) > 0 {
		n := min(len(ds), passChunk)
		select {
		case s.queue <- ds[:n:n]:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return s.err
		}
		ds = ds[n:]
	}
	return nil
}

// close waits for what was recorded to be sent and returns the first send
// error. Record after close takes nothing.
func (s *streamSink) close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.queue)
	}
	s.mu.Unlock()
	<-s.done
	return s.err
}
