package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
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

var _ sdk.Reaper = (*reaperClient)(nil)

// Reap runs a pass in the plugin, handing its decisions to sink as they
// arrive: those the pass made before failing too.
func (c *reaperClient) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
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
		return sdk.PassResult{}, fmt.Errorf("reap pass: %w", err)
	}
	var res sdk.PassResult
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("reap pass: %w", err)
		}
		if len(msg.Decisions.GetDecisions()) > 0 {
			if err := sink.Record(ctx, decisionsFromPB(msg.Decisions)); err != nil {
				return res, fmt.Errorf("reap pass: record decisions: %w", err)
			}
		}
		if msg.State != nil {
			res.State = msg.State
		}
	}
}

// reaperServer serves a plugin's Reaper, dialing the host's callbacks.
type reaperServer struct {
	pb.UnimplementedReaperServer
	impl   sdk.Reaper
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
	sink := newStreamSink(stream)
	res, err := s.impl.Reap(ctx, sdk.Pass{
		Now: tsFromPB(req.Now), Ladder: ladderFromPB(req.Ladder), Term: req.Term,
		DryRun: req.DryRun, Deadline: tsFromPB(req.Deadline), State: req.State, Edition: req.Edition,
	}, board, exec, sink)
	// What was recorded goes out even when the pass failed: the host keeps
	// what was decided before the error.
	sendErr := sink.close()
	// A failed pass may still hand back its state (what it owes its next
	// pass): it travels ahead of the error too.
	if sendErr == nil && (err == nil || res.State != nil) {
		sendErr = stream.Send(&pb.PassResponse{State: res.State})
	}
	if err != nil {
		return err
	}
	if sendErr != nil {
		return fmt.Errorf("send pass result: %w", sendErr)
	}
	return nil
}
