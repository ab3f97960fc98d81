package sdk

import (
	"context"
	"fmt"
	"sync"

	pb "github.com/dexaflow/reaper/sdk/proto/reaperv1"
)

// boardClient is a plugin's Board for one pass or sweep: every call goes
// back to the host. The next page of a full page of a listing is read
// ahead (see readAhead), sent with the pass's next write; close ends what
// is still in flight.
type boardClient struct {
	client     pb.BoardClient
	candidates *readAhead[CandidatePage]
	runs       *readAhead[RunPage]

	mu    sync.Mutex
	armed map[string]func() // read aheads waiting for the next write, by listing
}

var _ Board = (*boardClient)(nil)

func newBoardClient(ctx context.Context, client pb.BoardClient) *boardClient {
	return &boardClient{client: client, armed: map[string]func(){},
		candidates: newReadAhead[CandidatePage](ctx), runs: newReadAhead[RunPage](ctx)}
}

// arm keeps the read ahead of a listing's next page until the pass's next
// write. Between a listing and its marks a reaper mostly asks the
// substrate about the page, work that keeps the host busy; a write keeps
// the host waiting on the database, and the read ahead then costs the pass
// nothing. A reaper that writes nothing reads each page when it asks.
func (c *boardClient) arm(listing string, start func()) {
	c.mu.Lock()
	c.armed[listing] = start
	c.mu.Unlock()
}

// disarm drops the read ahead waiting for a listing: the listing is asked
// for now.
func (c *boardClient) disarm(listing string) {
	c.mu.Lock()
	delete(c.armed, listing)
	c.mu.Unlock()
}

// fire sends the read aheads waiting for a write.
func (c *boardClient) fire() {
	c.mu.Lock()
	armed := c.armed
	c.armed = map[string]func(){}
	c.mu.Unlock()
	for _, start := range armed {
		start()
	}
}

func (c *boardClient) close() {
	c.candidates.close()
	c.runs.close()
}

func (c *boardClient) ListCandidates(ctx context.Context, q CandidateQuery) (CandidatePage, error) {
	listing := listingKey(q)
	c.disarm("candidates " + listing)
	page, ok, err := c.candidates.take(ctx, listing, cursorKey(q.After))
	if err != nil {
		return CandidatePage{}, fmt.Errorf("board list candidates: %w", err)
	}
	if !ok {
		if page, err = c.listCandidates(ctx, q); err != nil {
			return CandidatePage{}, err
		}
	}
	if page.Next != nil && len(page.Candidates) > 0 {
		next := q
		next.After = page.Next
		c.arm("candidates "+listing, func() {
			c.candidates.start(listing, cursorKey(next.After), func(ctx context.Context) (CandidatePage, error) {
				return c.listCandidates(ctx, next)
			})
		})
	}
	return page, nil
}

func (c *boardClient) listCandidates(ctx context.Context, q CandidateQuery) (CandidatePage, error) {
	resp, err := c.client.ListCandidates(ctx, candidateQueryToPB(q))
	if err != nil {
		return CandidatePage{}, fmt.Errorf("board list candidates: %w", err)
	}
	return candidatePageFromPB(resp), nil
}

func (c *boardClient) Mark(ctx context.Context, marks []Mark) ([]MarkResult, error) {
	c.fire()
	resp, err := c.client.Mark(ctx, &pb.MarkRequest{Marks: marksToPB(marks)})
	if err != nil {
		return nil, fmt.Errorf("board mark: %w", err)
	}
	return markResultsFromPB(resp.Results, marks), nil
}

func (c *boardClient) ListOrphanRuns(ctx context.Context, q RunQuery) (RunPage, error) {
	listing := runListingKey(q)
	c.disarm("runs " + listing)
	page, ok, err := c.runs.take(ctx, listing, runCursorKey(q.After))
	if err != nil {
		return RunPage{}, fmt.Errorf("board list orphan runs: %w", err)
	}
	if !ok {
		if page, err = c.listOrphanRuns(ctx, q); err != nil {
			return RunPage{}, err
		}
	}
	if page.Next != nil && len(page.Runs) > 0 {
		next := q
		next.After = page.Next
		c.arm("runs "+listing, func() {
			c.runs.start(listing, runCursorKey(next.After), func(ctx context.Context) (RunPage, error) {
				return c.listOrphanRuns(ctx, next)
			})
		})
	}
	return page, nil
}

func (c *boardClient) listOrphanRuns(ctx context.Context, q RunQuery) (RunPage, error) {
	resp, err := c.client.ListOrphanRuns(ctx, &pb.RunQuery{
		OlderThan: tsToPB(q.OlderThan), After: runCursorToPB(q.After), Limit: int32(q.Limit),
	})
	if err != nil {
		return RunPage{}, fmt.Errorf("board list orphan runs: %w", err)
	}
	return runPageFromPB(resp), nil
}

func (c *boardClient) ReapRun(ctx context.Context, r RunReap) (RunReapResult, error) {
	c.fire()
	resp, err := c.client.ReapRun(ctx, &pb.RunReap{
		RunId: r.RunID, OlderThan: tsToPB(r.OlderThan), Term: r.Term, At: tsToPB(r.At), Message: r.Message,
	})
	if err != nil {
		return RunReapResult{}, fmt.Errorf("board reap run: %w", err)
	}
	return RunReapResult{Applied: resp.Applied, NoopReason: resp.NoopReason, Attached: attemptsFromPB(resp.Attached)}, nil
}

func (c *boardClient) AppendLog(ctx context.Context, term int64, lines []LogLine) error {
	c.fire()
	if _, err := c.client.AppendLog(ctx, &pb.AppendLogRequest{Lines: logLinesToPB(lines), Term: term}); err != nil {
		return fmt.Errorf("board append log: %w", err)
	}
	return nil
}

// boardServer is the host's Board service, served to plugins.
type boardServer struct {
	pb.UnimplementedBoardServer
	get func() (Board, error)
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
	return &pb.MarkResponse{Results: markResultsToPB(res, marks)}, nil
}

func (s *boardServer) ListOrphanRuns(ctx context.Context, q *pb.RunQuery) (*pb.RunPage, error) {
	b, err := s.get()
	if err != nil {
		return nil, err
	}
	page, err := b.ListOrphanRuns(ctx, RunQuery{OlderThan: tsFromPB(q.OlderThan), After: runCursorFromPB(q.After), Limit: int(q.Limit)})
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
	res, err := b.ReapRun(ctx, RunReap{RunID: r.RunId, OlderThan: tsFromPB(r.OlderThan), Term: r.Term, At: tsFromPB(r.At), Message: r.Message})
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
