package sdk

import (
	"context"
	"fmt"
	"sync"

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

func (c *reaperClient) Reap(ctx context.Context, pass Pass, board Board, exec Executions) (PassResult, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	id := c.callbacks.serve(board, exec)
	resp, err := c.client.Reap(ctx, &pb.PassRequest{
		Now: tsToPB(pass.Now), Ladder: ladderToPB(pass.Ladder), Term: pass.Term,
		DryRun: pass.DryRun, Deadline: tsToPB(pass.Deadline), State: pass.State,
		Edition: pass.Edition, BrokerId: id,
	})
	if err != nil {
		return PassResult{}, fmt.Errorf("reap pass: %w", err)
	}
	return PassResult{Decisions: decisionsFromPB(resp.Decisions), State: resp.State}, nil
}

// reaperServer serves a plugin's Reaper, dialing the host's callbacks.
type reaperServer struct {
	pb.UnimplementedReaperServer
	impl   Reaper
	dialer *brokerDialer
}

func (s *reaperServer) Reap(ctx context.Context, req *pb.PassRequest) (*pb.PassResponse, error) {
	conn, err := s.dialer.dial(req.BrokerId)
	if err != nil {
		return nil, err
	}
	board := newBoardClient(ctx, pb.NewBoardClient(conn))
	defer board.close()
	exec := &executionsClient{client: pb.NewSubstrateClient(conn)}
	res, err := s.impl.Reap(ctx, Pass{
		Now: tsFromPB(req.Now), Ladder: ladderFromPB(req.Ladder), Term: req.Term,
		DryRun: req.DryRun, Deadline: tsFromPB(req.Deadline), State: req.State, Edition: req.Edition,
	}, board, exec)
	if err != nil {
		return nil, err
	}
	return &pb.PassResponse{Decisions: decisionsToPB(res.Decisions), State: res.State}, nil
}
