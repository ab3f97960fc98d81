package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"

	pb "github.com/dexaflow/reaper/sdk/proto/reaperv1"
)

// reaperClient is the host's Reaper backed by a plugin process.
type reaperClient struct {
	baseClient
	client    pb.ReaperClient
	callbacks *callbackServer
	// passMu serializes passes: the callbacks serve the board and
	// executions of the pass in flight.
	passMu sync.Mutex
}

var _ Reaper = (*reaperClient)(nil)

// Reap runs a pass in the plugin. As an in-process reaper may, it returns
// with an error the decisions the pass made before failing.
func (c *reaperClient) Reap(ctx context.Context, pass Pass, board Board, exec Executions) (PassResult, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	id := c.callbacks.serve(board, exec)
	// The stream's own context ends with this call, whichever way it ends.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.Reap(ctx, &pb.PassRequest{
		Now: tsToPB(pass.Now), Ladder: ladderToPB(pass.Ladder), Term: pass.Term,
		DryRun: pass.DryRun, Deadline: tsToPB(pass.Deadline), State: pass.State,
		Edition: pass.Edition, BrokerId: id,
	})
	if err != nil {
		return PassResult{}, fmt.Errorf("reap pass: %w", err)
	}
	var res PassResult
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("reap pass: %w", err)
		}
		res.Decisions = append(res.Decisions, decisionsFromPB(msg.Decisions)...)
		if msg.State != nil {
			res.State = msg.State
		}
	}
}

// reaperServer serves a plugin's Reaper, dialing the host's callbacks.
type reaperServer struct {
	pb.UnimplementedReaperServer
	impl   Reaper
	dialer *brokerDialer
}

// passChunk bounds the decisions of one message of a pass's stream.
const passChunk = 1000

func (s *reaperServer) Reap(req *pb.PassRequest, stream grpc.ServerStreamingServer[pb.PassResponse]) error {
	ctx := stream.Context()
	conn, err := s.dialer.dial(req.BrokerId)
	if err != nil {
		return err
	}
	board := newBoardClient(ctx, pb.NewBoardClient(conn))
	defer board.close()
	exec := &executionsClient{client: pb.NewSubstrateClient(conn)}
	rep := newReporter(stream)
	res, err := s.impl.Reap(withReporter(ctx, rep), Pass{
		Now: tsFromPB(req.Now), Ladder: ladderFromPB(req.Ladder), Term: req.Term,
		DryRun: req.DryRun, Deadline: tsFromPB(req.Deadline), State: req.State, Edition: req.Edition,
	}, board, exec)
	sendErr := rep.close()
	// The rest of the decisions go out even when the pass failed: the
	// host records what was decided before the error.
	ds := res.Decisions
	for sendErr == nil && len(ds) > passChunk {
		sendErr = stream.Send(&pb.PassResponse{Decisions: decisionsToPB(ds[:passChunk])})
		ds = ds[passChunk:]
	}
	if sendErr == nil {
		last := &pb.PassResponse{Decisions: decisionsToPB(ds)}
		if err == nil {
			last.State = res.State
		}
		sendErr = stream.Send(last)
	}
	if err != nil {
		return err
	}
	if sendErr != nil {
		return fmt.Errorf("send pass result: %w", sendErr)
	}
	return nil
}
