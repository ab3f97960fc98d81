package plugin

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// executionsClient calls a Substrate service's executions methods: the
// plugin's substrate from the host, or the host's proxy from a reaper.
type executionsClient struct {
	client pb.SubstrateClient
}

var (
	_ sdk.Executions = (*executionsClient)(nil)
	_ sdk.ChangeFeed = (*executionsClient)(nil)
)

func (c *executionsClient) Liveness(ctx context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	resp, err := c.client.Liveness(ctx, &pb.LivenessRequest{
		Attempts: attemptsToPB(req.Attempts), Live: req.Live, Now: tsToPB(req.Now),
		PodUids: podUIDsToPB(req.Attempts, req.PodUIDs),
	})
	if err != nil {
		return nil, fmt.Errorf("substrate liveness: %w", err)
	}
	return livenessFromPB(resp.Results, req.Attempts), nil
}

func (c *executionsClient) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	in := &pb.TeardownRequest{RunId: req.RunID, Reason: req.Reason, Term: req.Term, PodUid: req.PodUID}
	if req.Attempt != nil {
		in.Attempt = attemptToPB(*req.Attempt)
	}
	resp, err := c.client.Teardown(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("substrate teardown: %w", err)
	}
	return teardownOutcomesFromPB(resp.Outcomes), nil
}

func (c *executionsClient) StopOrphan(ctx context.Context, req sdk.StopRequest) (sdk.StopResult, error) {
	resp, err := c.client.StopOrphan(ctx, &pb.StopRequest{Attempt: attemptToPB(req.Attempt), Reason: req.Reason})
	if err != nil {
		return sdk.StopResult{}, fmt.Errorf("substrate stop: %w", err)
	}
	return sdk.StopResult{Stopped: resp.Stopped, InFlight: resp.InFlight, Detail: resp.Detail}, nil
}

func (c *executionsClient) WarmWorkers(ctx context.Context) ([]sdk.WarmWorker, error) {
	resp, err := c.client.WarmWorkers(ctx, &pb.Empty{})
	if err != nil {
		return nil, fmt.Errorf("substrate warm workers: %w", err)
	}
	out := make([]sdk.WarmWorker, len(resp.Workers))
	for i, w := range resp.Workers {
		out[i] = sdk.WarmWorker{Name: w.Name, Phase: w.Phase}
	}
	return out, nil
}

// Changes reads the substrate's change feed. A substrate that predates the
// call answers Unimplemented, returned as an error: the caller looks at
// everything, as it would without the feed.
func (c *executionsClient) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	resp, err := c.client.Changes(ctx, &pb.ChangesRequest{Generation: since.Generation, Seq: since.Seq})
	if err != nil {
		return sdk.FeedChanges{}, fmt.Errorf("substrate changes: %w", err)
	}
	return sdk.FeedChanges{Cursor: sdk.FeedCursor{Generation: resp.Generation, Seq: resp.Seq},
		Complete: resp.Complete, Gone: attemptsFromPB(resp.Gone), Detail: resp.Detail}, nil
}

// substrateClient is the host's Substrate backed by a plugin process.
type substrateClient struct {
	baseClient
	client    pb.SubstrateClient
	callbacks *callbackServer
	sweepMu   sync.Mutex
}

var _ sdk.Substrate = (*substrateClient)(nil)

func (c *substrateClient) exec() *executionsClient { return &executionsClient{client: c.client} }

func (c *substrateClient) Liveness(ctx context.Context, req sdk.LivenessRequest) ([]sdk.AttemptLiveness, error) {
	return c.exec().Liveness(ctx, req)
}

func (c *substrateClient) Teardown(ctx context.Context, req sdk.TeardownRequest) ([]sdk.TeardownOutcome, error) {
	return c.exec().Teardown(ctx, req)
}

func (c *substrateClient) StopOrphan(ctx context.Context, req sdk.StopRequest) (sdk.StopResult, error) {
	return c.exec().StopOrphan(ctx, req)
}

func (c *substrateClient) WarmWorkers(ctx context.Context) ([]sdk.WarmWorker, error) {
	return c.exec().WarmWorkers(ctx)
}

func (c *substrateClient) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	return c.exec().Changes(ctx, since)
}

func (c *substrateClient) Sweep(ctx context.Context, req sdk.SweepRequest, board sdk.Board) (sdk.SweepResult, error) {
	c.sweepMu.Lock()
	defer c.sweepMu.Unlock()
	id := c.callbacks.serve(board, nil)
	resp, err := c.client.Sweep(ctx, &pb.SweepRequest{
		Now: tsToPB(req.Now), Term: req.Term, DryRun: req.DryRun, Ladder: ladderToPB(req.Ladder), BrokerId: id,
	})
	if err != nil {
		return sdk.SweepResult{}, fmt.Errorf("substrate sweep: %w", err)
	}
	return sdk.SweepResult{Decisions: decisionsFromPB(resp.Decisions), Overrides: resp.Overrides}, nil
}

func (c *substrateClient) Synced(ctx context.Context) (bool, error) {
	resp, err := c.client.Synced(ctx, &pb.Empty{})
	if err != nil {
		return false, fmt.Errorf("substrate synced: %w", err)
	}
	return resp.Synced, nil
}

// substrateServer serves the Substrate service. In a substrate plugin, full
// is the plugin and every method is served. In the host's callback server,
// only the executions methods are served (getExec), to reaper plugins.
type substrateServer struct {
	pb.UnimplementedSubstrateServer
	exec    sdk.Executions
	full    sdk.Substrate
	getExec func() (sdk.Executions, error)
	dialer  *brokerDialer
}

func (s *substrateServer) executions() (sdk.Executions, error) {
	if s.getExec != nil {
		return s.getExec()
	}
	return s.exec, nil
}

func (s *substrateServer) Liveness(ctx context.Context, req *pb.LivenessRequest) (*pb.LivenessResponse, error) {
	exec, err := s.executions()
	if err != nil {
		return nil, err
	}
	asked := attemptsFromPB(req.Attempts)
	res, err := exec.Liveness(ctx, sdk.LivenessRequest{Attempts: asked, Live: req.Live, Now: tsFromPB(req.Now),
		PodUIDs: podUIDsFromPB(asked, req.PodUids)})
	if err != nil {
		return nil, err
	}
	return &pb.LivenessResponse{Results: livenessToPB(res, asked)}, nil
}

func (s *substrateServer) Teardown(ctx context.Context, req *pb.TeardownRequest) (*pb.TeardownResponse, error) {
	exec, err := s.executions()
	if err != nil {
		return nil, err
	}
	in := sdk.TeardownRequest{RunID: req.RunId, Reason: req.Reason, Term: req.Term, PodUID: req.PodUid}
	if req.Attempt != nil {
		a := attemptFromPB(req.Attempt)
		in.Attempt = &a
	}
	res, err := exec.Teardown(ctx, in)
	if err != nil {
		return nil, err
	}
	return &pb.TeardownResponse{Outcomes: teardownOutcomesToPB(res)}, nil
}

func (s *substrateServer) StopOrphan(ctx context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	exec, err := s.executions()
	if err != nil {
		return nil, err
	}
	res, err := exec.StopOrphan(ctx, sdk.StopRequest{Attempt: attemptFromPB(req.Attempt), Reason: req.Reason})
	if err != nil {
		return nil, err
	}
	return &pb.StopResponse{Stopped: res.Stopped, InFlight: res.InFlight, Detail: res.Detail}, nil
}

func (s *substrateServer) WarmWorkers(ctx context.Context, _ *pb.Empty) (*pb.WarmWorkersResponse, error) {
	exec, err := s.executions()
	if err != nil {
		return nil, err
	}
	ws, err := exec.WarmWorkers(ctx)
	if err != nil {
		return nil, err
	}
	resp := &pb.WarmWorkersResponse{Workers: make([]*pb.WarmWorker, len(ws))}
	for i, w := range ws {
		resp.Workers[i] = &pb.WarmWorker{Name: w.Name, Phase: w.Phase}
	}
	return resp, nil
}

// Changes serves the change feed of a substrate that has one; another
// answers Unimplemented, as a plugin built before the call does.
func (s *substrateServer) Changes(ctx context.Context, req *pb.ChangesRequest) (*pb.ChangesResponse, error) {
	exec, err := s.executions()
	if err != nil {
		return nil, err
	}
	feed, ok := exec.(sdk.ChangeFeed)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "the substrate has no change feed")
	}
	res, err := feed.Changes(ctx, sdk.FeedCursor{Generation: req.Generation, Seq: req.Seq})
	if err != nil {
		return nil, err
	}
	return &pb.ChangesResponse{Generation: res.Cursor.Generation, Seq: res.Cursor.Seq, Complete: res.Complete,
		Gone: attemptsToPB(res.Gone), Detail: res.Detail}, nil
}

func (s *substrateServer) Sweep(ctx context.Context, req *pb.SweepRequest) (*pb.SweepResponse, error) {
	if s.full == nil {
		return nil, fmt.Errorf("sweep: %w", errNoCallback)
	}
	conn, err := s.dialer.dial(req.BrokerId)
	if err != nil {
		return nil, err
	}
	board := newBoardClient(ctx, pb.NewBoardClient(conn))
	defer board.close()
	res, err := s.full.Sweep(ctx, sdk.SweepRequest{
		Now: tsFromPB(req.Now), Term: req.Term, DryRun: req.DryRun, Ladder: ladderFromPB(req.Ladder),
	}, board)
	if err != nil {
		return nil, err
	}
	return &pb.SweepResponse{Decisions: decisionsToPB(res.Decisions), Overrides: res.Overrides}, nil
}

func (s *substrateServer) Synced(ctx context.Context, _ *pb.Empty) (*pb.SyncedResponse, error) {
	if s.full == nil {
		return nil, fmt.Errorf("synced: %w", errNoCallback)
	}
	ok, err := s.full.Synced(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.SyncedResponse{Synced: ok}, nil
}
