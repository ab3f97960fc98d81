package plugin

import (
	"context"
	"fmt"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// boardClient is a plugin's Board for one pass or sweep: every call goes
// back to the host. The next page of a full page of a listing is read
// ahead (see readAhead), sent with the pass's next write; close ends what
// is still in flight.
type boardClient struct {
	client     pb.BoardClient
	candidates *readAhead[sdk.CandidatePage]
	runs       *readAhead[sdk.RunPage]
}

var _ sdk.Board = (*boardClient)(nil)

func newBoardClient(ctx context.Context, client pb.BoardClient) *boardClient {
	return &boardClient{client: client,
		candidates: newReadAhead[sdk.CandidatePage](ctx), runs: newReadAhead[sdk.RunPage](ctx)}
}

// fire sends the read aheads armed since the last write. Between a
// listing and its marks a reaper mostly asks the substrate about the page,
// work that keeps the host busy; a write keeps the host waiting on the
// database, and a read ahead sent with it costs the pass nothing. A
// reaper that writes nothing reads each page when it asks.
func (c *boardClient) fire() {
	c.candidates.fire()
	c.runs.fire()
}

func (c *boardClient) close() {
	c.candidates.close()
	c.runs.close()
}

func (c *boardClient) ListCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	return c.candidates.serve(ctx, listingKey(q), cursorKey(q.After),
		func(ctx context.Context) (sdk.CandidatePage, error) { return c.listCandidates(ctx, q) },
		func(page sdk.CandidatePage) (string, func(context.Context) (sdk.CandidatePage, error), bool) {
			if page.Next == nil || len(page.Candidates) == 0 {
				return "", nil, false
			}
			next := q
			next.After = page.Next
			return cursorKey(next.After), func(ctx context.Context) (sdk.CandidatePage, error) { return c.listCandidates(ctx, next) }, true
		})
}

func (c *boardClient) listCandidates(ctx context.Context, q sdk.CandidateQuery) (sdk.CandidatePage, error) {
	resp, err := c.client.ListCandidates(ctx, candidateQueryToPB(q))
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board list candidates: %w", err)
	}
	return candidatePageFromPB(resp), nil
}

func (c *boardClient) Mark(ctx context.Context, marks []sdk.Mark) ([]sdk.MarkResult, error) {
	c.fire()
	resp, err := c.client.Mark(ctx, &pb.MarkRequest{Marks: marksToPB(marks)})
	if err != nil {
		return nil, fmt.Errorf("board mark: %w", err)
	}
	return markResultsFromPB(resp.Results, attemptsOf(marks, markAttempt)), nil
}

func (c *boardClient) ListOrphanRuns(ctx context.Context, q sdk.RunQuery) (sdk.RunPage, error) {
	return c.runs.serve(ctx, runListingKey(q), runCursorKey(q.After),
		func(ctx context.Context) (sdk.RunPage, error) { return c.listOrphanRuns(ctx, q) },
		func(page sdk.RunPage) (string, func(context.Context) (sdk.RunPage, error), bool) {
			if page.Next == nil || len(page.Runs) == 0 {
				return "", nil, false
			}
			next := q
			next.After = page.Next
			return runCursorKey(next.After), func(ctx context.Context) (sdk.RunPage, error) { return c.listOrphanRuns(ctx, next) }, true
		})
}

func (c *boardClient) listOrphanRuns(ctx context.Context, q sdk.RunQuery) (sdk.RunPage, error) {
	resp, err := c.client.ListOrphanRuns(ctx, runQueryToPB(q))
	if err != nil {
		return sdk.RunPage{}, fmt.Errorf("board list orphan runs: %w", err)
	}
	return runPageFromPB(resp), nil
}

func (c *boardClient) ReapRun(ctx context.Context, r sdk.RunReap) (sdk.RunReapResult, error) {
	c.fire()
	resp, err := c.client.ReapRun(ctx, runReapToPB(r))
	if err != nil {
		return sdk.RunReapResult{}, fmt.Errorf("board reap run: %w", err)
	}
	return sdk.RunReapResult{Applied: resp.Applied, NoopReason: resp.NoopReason, Attached: attemptsFromPB(resp.Attached)}, nil
}

func (c *boardClient) AppendLog(ctx context.Context, term int64, lines []sdk.LogLine) error {
	c.fire()
	if _, err := c.client.AppendLog(ctx, &pb.AppendLogRequest{Lines: logLinesToPB(lines), Term: term}); err != nil {
		return fmt.Errorf("board append log: %w", err)
	}
	return nil
}

func (c *boardClient) ListProvisional(ctx context.Context, q sdk.ProvisionalQuery) (sdk.CandidatePage, error) {
	resp, err := c.client.ListProvisional(ctx, provisionalQueryToPB(q))
	if err != nil {
		return sdk.CandidatePage{}, fmt.Errorf("board list provisional marks: %w", err)
	}
	return candidatePageFromPB(resp), nil
}

func (c *boardClient) ConfirmInfra(ctx context.Context, cs []sdk.Confirm) ([]sdk.MarkResult, error) {
	c.fire()
	resp, err := c.client.ConfirmInfra(ctx, &pb.ConfirmRequest{Confirms: confirmsToPB(cs)})
	if err != nil {
		return nil, fmt.Errorf("board confirm infra: %w", err)
	}
	return markResultsFromPB(resp.Results, attemptsOf(cs, confirmAttempt)), nil
}

func (c *boardClient) OverrideInfra(ctx context.Context, os []sdk.Override) ([]sdk.MarkResult, error) {
	c.fire()
	resp, err := c.client.OverrideInfra(ctx, &pb.OverrideRequest{Overrides: overridesToPB(os)})
	if err != nil {
		return nil, fmt.Errorf("board override infra: %w", err)
	}
	return markResultsFromPB(resp.Results, attemptsOf(os, overrideAttempt)), nil
}

func (c *boardClient) Settle(ctx context.Context, ss []sdk.Settlement) ([]sdk.MarkResult, error) {
	c.fire()
	resp, err := c.client.Settle(ctx, &pb.SettleRequest{Settlements: settlementsToPB(ss)})
	if err != nil {
		return nil, fmt.Errorf("board settle: %w", err)
	}
	return markResultsFromPB(resp.Results, attemptsOf(ss, settlementAttempt)), nil
}

func (c *boardClient) RecordPodSightings(ctx context.Context, ss []sdk.PodSighting) ([]sdk.MarkResult, error) {
	c.fire()
	resp, err := c.client.RecordPodSightings(ctx, &pb.PodSightingsRequest{Sightings: sightingsToPB(ss)})
	if err != nil {
		return nil, fmt.Errorf("board record pod sightings: %w", err)
	}
	return markResultsFromPB(resp.Results, attemptsOf(ss, sightingAttempt)), nil
}

// boardServer is the host's Board service, served to plugins.
type boardServer struct {
	pb.UnimplementedBoardServer
	get func() (sdk.Board, error)
}

func (s *boardServer) ListCandidates(ctx context.Context, q *pb.CandidateQuery) (*pb.CandidatePage, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	page, err := b.ListCandidates(ctx, candidateQueryFromPB(q))
	if err != nil {
		return nil, err
	}
	return candidatePageToPB(page), nil
}

func (s *boardServer) Mark(ctx context.Context, req *pb.MarkRequest) (*pb.MarkResponse, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	marks := marksFromPB(req.Marks)
	res, err := b.Mark(ctx, marks)
	if err != nil {
		return nil, err
	}
	return &pb.MarkResponse{Results: markResultsToPB(res, attemptsOf(marks, markAttempt))}, nil
}

func (s *boardServer) ListOrphanRuns(ctx context.Context, q *pb.RunQuery) (*pb.RunPage, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	page, err := b.ListOrphanRuns(ctx, runQueryFromPB(q))
	if err != nil {
		return nil, err
	}
	return runPageToPB(page), nil
}

func (s *boardServer) ReapRun(ctx context.Context, r *pb.RunReap) (*pb.RunReapResult, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	res, err := b.ReapRun(ctx, runReapFromPB(r))
	if err != nil {
		return nil, err
	}
	return &pb.RunReapResult{Applied: res.Applied, NoopReason: res.NoopReason, Attached: attemptsToPB(res.Attached)}, nil
}

func (s *boardServer) AppendLog(ctx context.Context, req *pb.AppendLogRequest) (*pb.Empty, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	if err := b.AppendLog(ctx, req.Term, logLinesFromPB(req.Lines)); err != nil {
		return nil, err
	}
	return &pb.Empty{}, nil
}

func (s *boardServer) ListProvisional(ctx context.Context, q *pb.ProvisionalQuery) (*pb.CandidatePage, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	page, err := b.ListProvisional(ctx, provisionalQueryFromPB(q))
	if err != nil {
		return nil, err
	}
	return candidatePageToPB(page), nil
}

func (s *boardServer) ConfirmInfra(ctx context.Context, req *pb.ConfirmRequest) (*pb.MarkResponse, error) {
	cs := confirmsFromPB(req.Confirms)
	return serveBatch(s, cs, confirmAttempt, func(b sdk.Board) ([]sdk.MarkResult, error) { return b.ConfirmInfra(ctx, cs) })
}

func (s *boardServer) OverrideInfra(ctx context.Context, req *pb.OverrideRequest) (*pb.MarkResponse, error) {
	os := overridesFromPB(req.Overrides)
	return serveBatch(s, os, overrideAttempt, func(b sdk.Board) ([]sdk.MarkResult, error) { return b.OverrideInfra(ctx, os) })
}

func (s *boardServer) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.MarkResponse, error) {
	ss := settlementsFromPB(req.Settlements)
	return serveBatch(s, ss, settlementAttempt, func(b sdk.Board) ([]sdk.MarkResult, error) { return b.Settle(ctx, ss) })
}

func (s *boardServer) RecordPodSightings(ctx context.Context, req *pb.PodSightingsRequest) (*pb.MarkResponse, error) {
	ss := sightingsFromPB(req.Sightings)
	return serveBatch(s, ss, sightingAttempt, func(b sdk.Board) ([]sdk.MarkResult, error) { return b.RecordPodSightings(ctx, ss) })
}

// serveBatch answers a guarded batch write on the host's board.
func serveBatch[T any](s *boardServer, reqs []T, attempt func(T) sdk.Attempt, write func(sdk.Board) ([]sdk.MarkResult, error)) (*pb.MarkResponse, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	res, err := write(b)
	if err != nil {
		return nil, err
	}
	return &pb.MarkResponse{Results: markResultsToPB(res, attemptsOf(reqs, attempt))}, nil
}
