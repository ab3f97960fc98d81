package audit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/host/audit"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)

// gated is a Writer whose writes wait for a go-ahead, one per write, and
// that fails the writes it is told to.
type gated struct {
	mu      sync.Mutex
	batches [][]sdk.Decision
	started chan int      // the size of each write as it starts
	proceed chan struct{} // one per write
	fail    map[int]error // by write number, from 0
}

func newGated() *gated {
	return &gated{started: make(chan int, 16), proceed: make(chan struct{}, 16), fail: map[int]error{}}
}

func (g *gated) RecordDecisions(_ context.Context, _ int64, _ time.Time, ds []sdk.Decision) error {
	g.started <- len(ds)
	<-g.proceed
	g.mu.Lock()
	defer g.mu.Unlock()
	n := len(g.batches)
	g.batches = append(g.batches, ds)
	return g.fail[n]
}

func decisions(from, n int) []sdk.Decision {
	out := make([]sdk.Decision, n)
	for i := range out {
		out[i] = sdk.Decision{Label: sdk.LabelAgentLost, Applied: true,
			Attempt: sdk.Attempt{RunID: fmt.Sprintf("run%06d", (from+i)/10), TaskID: fmt.Sprintf("task%02d", (from+i)%10), Try: 1}}
	}
	return out
}

// The audit is written while the pass goes on: Record hands the first batch
// to a write at once and returns without waiting for it; what arrives
// during a write goes in the next one, in order; Wait returns once all is
// written.
func TestSink_WritesBesideThePassNeverBlockingIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", false)
	if err := s.Record(ctx, decisions(0, 100)); err != nil {
		t.Fatal(err)
	}
	if n := <-g.started; n != 100 {
		t.Fatalf("first write of %d decisions, want 100", n)
	}
	// The first write is still under way: these wait for the next one.
	if err := s.Record(ctx, decisions(100, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(ctx, decisions(200, 50)); err != nil {
		t.Fatal(err)
	}
	g.proceed <- struct{}{}
	if n := <-g.started; n != 150 {
		t.Fatalf("second write of %d decisions, want the 150 recorded during the first", n)
	}
	g.proceed <- struct{}{}
	all, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 250 || len(g.batches) != 2 {
		t.Fatalf("%d decisions kept, %d writes", len(all), len(g.batches))
	}
	var written []sdk.Decision
	for _, b := range g.batches {
		written = append(written, b...)
	}
	for i := range all {
		if all[i].Attempt != written[i].Attempt || all[i].Attempt != decisions(i, 1)[0].Attempt {
			t.Fatalf("decision %d out of order: kept %s, written %s", i, all[i].Attempt, written[i].Attempt)
		}
	}
}

// A write that fails is returned by Wait, and does not stop the writes of
// what comes after it.
func TestSink_FailedWriteSurfacesAndLaterWritesGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	g.fail[0] = errors.New("connection reset")
	for range 4 {
		g.proceed <- struct{}{}
	}
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", false)
	if err := s.Record(ctx, decisions(0, 10)); err != nil {
		t.Fatalf("Record failed with the audit: %v", err)
	}
	<-g.started
	// Written after the first write, whether it is still under way or not.
	if err := s.Record(ctx, decisions(10, 5)); err != nil {
		t.Fatal(err)
	}
	all, err := s.Wait()
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("Wait: %v, want the failed write", err)
	}
	if len(g.batches) != 2 || len(g.batches[1]) != 5 || len(all) != 15 {
		t.Fatalf("%d writes, %d decisions kept", len(g.batches), len(all))
	}
}

// Every decision is stamped with the reaper's name when it has none, and a
// dry run's never claims to be applied, before it is written. A decision
// under another reaper's name is not written under it: its refusal, under
// the sink's reaper, takes its place.
func TestSink_StampsReaperAndDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	g.proceed <- struct{}{}
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", true)
	ds := decisions(0, 2)
	ds[1].Reaper = "other"
	if err := s.Record(ctx, ds); err != nil {
		t.Fatal(err)
	}
	all, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range append(all, g.batches[0]...) {
		if !d.DryRun || d.Applied || d.Reaper != "agentlost" {
			t.Fatalf("decision %d: %+v", i, d)
		}
		if refused := d.Label == sdk.LabelBoardRefusedForeignReaper; refused != (i%2 == 1) ||
			(refused && d.Evidence[audit.EvAskedReaper] != "other") {
			t.Fatalf("decision %d: %+v, want the foreign name refused", i, d)
		}
	}
	if !ds[0].Applied || ds[0].Reaper != "" || ds[1].Reaper != "other" {
		t.Fatalf("the caller's decisions changed: %+v", ds)
	}
}

// A sink told the labels its plugin declared takes no decision under any
// other: its refusal takes its place, under a fixed label, and the asked
// label is only evidence (clipped, however long).
func TestSink_RefusesAnUndeclaredLabel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := audit.NewSink(ctx, nil, 7, t0, "agentlost", false)
	s.Only(sdk.AllowedLabels(sdk.Info{MarkReasons: []string{sdk.LabelAgentLost}}))
	ds := decisions(0, 3)
	ds[1].Label = "made_up_" + strings.Repeat("x", 10_000)
	ds[2].Label = sdk.LabelMarkNoop // common to every reaper
	if err := s.Record(ctx, ds); err != nil {
		t.Fatal(err)
	}
	all, _ := s.Wait()
	want := []string{sdk.LabelAgentLost, sdk.LabelBoardRefusedUndeclaredLabel, sdk.LabelMarkNoop}
	for i, d := range all {
		if d.Label != want[i] || d.Reaper != "agentlost" {
			t.Fatalf("decision %d: %+v, want %s", i, d, want[i])
		}
	}
	if r := all[1]; r.Applied || len(r.Evidence[audit.EvAskedLabel]) > 200 ||
		!strings.HasPrefix(r.Evidence[audit.EvAskedLabel], "made_up_") {
		t.Fatalf("refusal %+v, want not applied, the asked label clipped", r)
	}
}

// On the board, a mass recovery's decisions recorded in many batches are
// all in reap_decisions once Wait returns, in order.
func TestSink_EveryDecisionReachesTheBoard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	store := board.New(pool, board.Options{})
	s := audit.NewSink(ctx, store, 3, t0, "agentlost", false)
	const n = 12_000
	for from := 0; from < n; from += 100 {
		if err := s.Record(ctx, decisions(from, 100)); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var count, ordered int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE reaper = 'agentlost' AND term = 3)
        FROM reap_decisions`).Scan(&count, &ordered); err != nil {
		t.Fatal(err)
	}
	if count != n || ordered != n || len(all) != n {
		t.Fatalf("%d rows (%d stamped), %d kept; want %d", count, ordered, len(all), n)
	}
	var last string
	if err := pool.QueryRow(ctx, `SELECT run_id || '/' || task_id FROM reap_decisions ORDER BY id DESC LIMIT 1`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if want := decisions(n-1, 1)[0].Attempt; last != want.RunID+"/"+want.TaskID {
		t.Fatalf("last row %s, want %s", last, want)
	}
}

// What a failed write left out of the audit is handed back for the host
// to write later: the whole batch, or, when the board says its first
// chunks were written, only the rest.
func TestSink_UnwrittenIsWhatTheFailedWritesLeftOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	g.fail[0] = errors.New("connection refused")
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", false)
	if err := s.Record(ctx, decisions(0, 3)); err != nil {
		t.Fatal(err)
	}
	<-g.started
	g.proceed <- struct{}{}
	if _, err := s.Wait(); err == nil {
		t.Fatal("the failed write was not reported")
	}
	if got := s.Unwritten(); len(got) != 3 || got[0].Attempt != decisions(0, 1)[0].Attempt {
		t.Fatalf("unwritten %+v, want the failed batch", got)
	}
	partial := &board.PartialAuditError{Written: 2, Total: 3, Err: errors.New("timeout")}
	if got := audit.Unwritten(decisions(0, 3), fmt.Errorf("wrapped: %w", partial)); len(got) != 1 ||
		got[0].Attempt != decisions(2, 1)[0].Attempt {
		t.Fatalf("unwritten of a partial write %+v, want the last decision", got)
	}
}

// A sink that streams hands each batch on once its write is over, in the
// order recorded, failed writes included, and keeps none of them: Wait
// returns once the stream has seen every decision.
func TestSink_StreamHandsEachBatchOnOnceWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	g.fail[1] = errors.New("connection reset")
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", false)
	var (
		mu       sync.Mutex
		streamed []sdk.Decision
		writes   []int // how many writes had ended when each batch came
	)
	s.Stream(func(ds []sdk.Decision) {
		mu.Lock()
		defer mu.Unlock()
		streamed = append(streamed, ds...)
		g.mu.Lock()
		writes = append(writes, len(g.batches))
		g.mu.Unlock()
	})
	for i := range 3 {
		if err := s.Record(ctx, decisions(i*100, 100)); err != nil {
			t.Fatal(err)
		}
		<-g.started
		mu.Lock()
		seen := len(streamed)
		mu.Unlock()
		if seen != i*100 {
			t.Fatalf("write %d under way: %d decisions streamed, want %d (only what was written)", i, seen, i*100)
		}
		g.proceed <- struct{}{}
		// Wait for the batch to come out of the stream before the next.
		for {
			mu.Lock()
			seen = len(streamed)
			mu.Unlock()
			if seen == (i+1)*100 {
				break
			}
			runtime.Gosched()
		}
	}
	all, err := s.Wait()
	if err == nil || len(all) != 0 {
		t.Fatalf("Wait: %d decisions kept, error %v; want none kept and the failed write", len(all), err)
	}
	if len(s.Unwritten()) != 100 {
		t.Fatalf("%d decisions unwritten, want the failed write's 100", len(s.Unwritten()))
	}
	for i, d := range streamed {
		if d.Attempt != decisions(i, 1)[0].Attempt || d.Reaper != "agentlost" {
			t.Fatalf("streamed decision %d is %+v", i, d)
		}
	}
	if want := []int{1, 2, 3}; !slices.Equal(writes, want) {
		t.Fatalf("batches streamed after %v writes, want %v", writes, want)
	}
}

// Without a Writer, a streaming sink hands each batch on as it is recorded.
func TestSink_StreamWithoutWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := audit.NewSink(ctx, nil, 7, t0, "agentlost", true)
	var streamed []sdk.Decision
	s.Stream(func(ds []sdk.Decision) { streamed = append(streamed, ds...) })
	if err := s.Record(ctx, decisions(0, 10)); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != 10 || streamed[0].Applied || !streamed[0].DryRun {
		t.Fatalf("streamed %+v, want the 10 recorded, as a dry run's", streamed)
	}
	if all, err := s.Wait(); err != nil || len(all) != 0 {
		t.Fatalf("Wait: %d kept, %v", len(all), err)
	}
}

// Once Wait returned, the stream is over: a decision recorded later (a
// plugin that kept the sink past its pass) is written and kept, never
// handed to the stream.
func TestSink_StreamEndsWithWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newGated()
	for range 2 {
		g.proceed <- struct{}{}
	}
	s := audit.NewSink(ctx, g, 7, t0, "agentlost", false)
	var mu sync.Mutex
	streamed := 0
	s.Stream(func(ds []sdk.Decision) {
		mu.Lock()
		defer mu.Unlock()
		streamed += len(ds)
	})
	if err := s.Record(ctx, decisions(0, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(ctx, decisions(10, 5)); err != nil {
		t.Fatal(err)
	}
	late, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if streamed != 10 || len(late) != 5 || len(g.batches) != 2 {
		t.Fatalf("%d streamed, %d kept after Wait, %d writes: want 10, the late 5, 2", streamed, len(late), len(g.batches))
	}
}
