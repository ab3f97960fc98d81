package plugin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// pagedBoard answers ListCandidates over rows ordered by task id, as the
// host would, and records every cursor it was asked for. hold, when set,
// makes the next listing after the given task id wait until its call is
// cancelled.
type pagedBoard struct {
	pb.BoardClient // only ListCandidates is served

	rows []sdk.Candidate
	at   time.Time

	mu      sync.Mutex
	asked   []string // cursor task ids, "" for the first page
	fail    map[string]int
	hold    string
	held    chan struct{}
	stopped chan error
}

func newPagedBoard(n int) *pagedBoard {
	b := &pagedBoard{at: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), fail: map[string]int{}}
	for i := range n {
		b.rows = append(b.rows, sdk.Candidate{Attempt: sdk.Attempt{RunID: "run", TaskID: fmt.Sprintf("t%04d", i), Try: 1},
			State: sdk.StateRunning, LastHeartbeatAt: b.at})
	}
	return b
}

func (b *pagedBoard) ListCandidates(ctx context.Context, q *pb.CandidateQuery, _ ...grpc.CallOption) (*pb.CandidatePage, error) {
	after := ""
	if q.After != nil {
		after = q.After.TaskId
	}
	b.mu.Lock()
	b.asked = append(b.asked, after)
	failing := b.fail[after] > 0
	if failing {
		b.fail[after]--
	}
	hold := b.hold != "" && b.hold == after
	if hold {
		b.hold = "" // once
	}
	b.mu.Unlock()
	if hold {
		close(b.held)
		<-ctx.Done()
		b.stopped <- ctx.Err()
		return nil, ctx.Err()
	}
	if failing {
		return nil, errors.New("host unreachable")
	}
	var page sdk.CandidatePage
	for _, r := range b.rows {
		if r.TaskID > after && len(page.Candidates) < int(q.Limit) {
			page.Candidates = append(page.Candidates, r)
		}
	}
	if len(page.Candidates) == int(q.Limit) {
		last := page.Candidates[len(page.Candidates)-1]
		page.Next = &sdk.Cursor{At: b.at, RunID: last.RunID, TaskID: last.TaskID}
	}
	return candidatePageToPB(page), nil
}

// Mark answers nothing: the tests write only to send the read aheads.
func (b *pagedBoard) Mark(context.Context, *pb.MarkRequest, ...grpc.CallOption) (*pb.MarkResponse, error) {
	return &pb.MarkResponse{}, nil
}

func (b *pagedBoard) cursorsAsked() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.asked...)
}

// drain lists every page of q through c, writing after each page as a
// reaper marks, and returns the task ids listed.
func drain(t *testing.T, c *boardClient, q sdk.CandidateQuery) []string {
	t.Helper()
	var ids []string
	for {
		page, err := c.ListCandidates(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		mark(t, c)
		for _, cand := range page.Candidates {
			ids = append(ids, cand.TaskID)
		}
		if page.Next == nil {
			return ids
		}
		q.After = page.Next
	}
}

func mark(t *testing.T, c *boardClient) {
	t.Helper()
	if _, err := c.Mark(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

func TestReadAheadListsEveryPageOnce(t *testing.T) {
	b := newPagedBoard(250)
	c := newBoardClient(context.Background(), b)
	defer c.close()
	ids := drain(t, c, sdk.CandidateQuery{States: []string{sdk.StateRunning}, Limit: 100})
	if len(ids) != 250 || ids[0] != "t0000" || ids[249] != "t0249" {
		t.Fatalf("listed %d rows (%v ... %v)", len(ids), ids[:1], ids[len(ids)-1:])
	}
	// Pages two and three were read ahead, each once; nothing is read
	// after the short last page.
	if got, want := b.cursorsAsked(), []string{"", "t0099", "t0199"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cursors asked %v, want %v", got, want)
	}
}

func TestReadAheadWaitsForAWrite(t *testing.T) {
	b := newPagedBoard(250)
	c := newBoardClient(context.Background(), b)
	defer c.close()
	q := sdk.CandidateQuery{Limit: 100}
	page, err := c.ListCandidates(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	// No write yet: the second page is read when asked, not before.
	q.After = page.Next
	if _, err := c.ListCandidates(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	c.close()
	if got, want := b.cursorsAsked(), []string{"", "t0099"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cursors asked %v, want %v", got, want)
	}
}

func TestReadAheadKeepsListingsApart(t *testing.T) {
	b := newPagedBoard(300)
	c := newBoardClient(context.Background(), b)
	defer c.close()
	q1 := sdk.CandidateQuery{States: []string{sdk.StateRunning}, Limit: 100}
	q2 := sdk.CandidateQuery{States: []string{sdk.StateRunning}, Heartbeat: sdk.HeartbeatNever, Limit: 100}
	p1, err := c.ListCandidates(context.Background(), q1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := c.ListCandidates(context.Background(), q2)
	if err != nil {
		t.Fatal(err)
	}
	mark(t, c) // sends both listings' read aheads
	q1.After, q2.After = p1.Next, p2.Next
	for _, q := range []sdk.CandidateQuery{q1, q2} {
		page, err := c.ListCandidates(context.Background(), q)
		if err != nil || page.Candidates[0].TaskID != "t0100" {
			t.Fatalf("second page: %v %v", page.Candidates[:1], err)
		}
	}
	mark(t, c)
	// Each listing's second page was read once, ahead; each listing now
	// has its third page in flight.
	c.close()
	if got := len(b.cursorsAsked()); got != 6 {
		t.Fatalf("%d listings, want 6: %v", got, b.cursorsAsked())
	}
}

func TestReadAheadDroppedWhenAnotherPageIsAsked(t *testing.T) {
	b := newPagedBoard(250)
	b.hold, b.held, b.stopped = "t0099", make(chan struct{}), make(chan error, 1)
	c := newBoardClient(context.Background(), b)
	defer c.close()
	q := sdk.CandidateQuery{States: []string{sdk.StateRunning}, Limit: 100}
	if _, err := c.ListCandidates(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	mark(t, c)
	<-b.held // page two is being read ahead
	// The plugin starts the listing over instead: the read ahead is
	// cancelled and the first page read again.
	page, err := c.ListCandidates(context.Background(), q)
	if err != nil || page.Candidates[0].TaskID != "t0000" {
		t.Fatalf("first page again: %v %v", page.Candidates[:1], err)
	}
	if err := <-b.stopped; !errors.Is(err, context.Canceled) {
		t.Fatalf("read ahead ended with %v, want cancelled", err)
	}
}

func TestReadAheadEndsWithThePass(t *testing.T) {
	b := newPagedBoard(250)
	b.hold, b.held, b.stopped = "t0099", make(chan struct{}), make(chan error, 1)
	c := newBoardClient(context.Background(), b)
	if _, err := c.ListCandidates(context.Background(), sdk.CandidateQuery{Limit: 100}); err != nil {
		t.Fatal(err)
	}
	mark(t, c)
	<-b.held
	c.close() // returns only once the read ahead has stopped
	select {
	case err := <-b.stopped:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("read ahead ended with %v, want cancelled", err)
		}
	default:
		t.Fatal("close returned while a read ahead was still in flight")
	}
}

func TestReadAheadFailureIsReadAgain(t *testing.T) {
	b := newPagedBoard(150)
	b.fail["t0099"] = 1 // the read ahead of page two fails once
	c := newBoardClient(context.Background(), b)
	defer c.close()
	ids := drain(t, c, sdk.CandidateQuery{Limit: 100})
	if len(ids) != 150 {
		t.Fatalf("listed %d rows, want 150", len(ids))
	}
	if got, want := b.cursorsAsked(), []string{"", "t0099", "t0099"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cursors asked %v, want %v", got, want)
	}

	b.fail["t0099"] = 2 // and now the caller's own read fails too
	q := sdk.CandidateQuery{Limit: 100}
	page, err := c.ListCandidates(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	mark(t, c)
	q.After = page.Next
	if _, err := c.ListCandidates(context.Background(), q); err == nil {
		t.Fatal("a failing listing reported no error")
	}
}
