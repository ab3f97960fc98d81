package reap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
)

var t0 = time.Date(2030, 1, 7, 9, 0, 0, 0, time.UTC)

// fakeListing serves `rows` rows in pages of 100 (a cursor's RunID is the
// index of the next row), advancing the stopwatch by cost per page.
type fakeListing struct {
	name  string
	rows  int
	cost  time.Duration
	clk   *clock.Fake
	pages int
	fail  error
}

func (f *fakeListing) listing() Listing {
	return Listing{Name: f.name, Page: func(ctx context.Context, after *Cursor) (*Cursor, error) {
		if f.fail != nil {
			return nil, f.fail
		}
		f.pages++
		f.clk.Advance(f.cost)
		start := 0
		if after != nil {
			fmt.Sscan(after.RunID, &start)
		}
		next := start + 100
		if next > f.rows {
			return nil, nil // short page
		}
		return &Cursor{At: t0, RunID: fmt.Sprint(next)}, nil
	}}
}

// sizedListing serves rows pages of the size asked, advancing the
// stopwatch by perRow a row, and notes each page's limit.
type sizedListing struct {
	name   string
	rows   int
	perRow time.Duration
	clk    *clock.Fake
	limits []int
}

func (f *sizedListing) listing() Listing {
	return Listing{Name: f.name, Sized: func(ctx context.Context, after *Cursor, limit int) (*Cursor, int, error) {
		f.limits = append(f.limits, limit)
		start := 0
		if after != nil {
			fmt.Sscan(after.RunID, &start)
		}
		n := min(limit, f.rows-start)
		f.clk.Advance(time.Duration(n) * f.perRow)
		if n < limit {
			return nil, n, nil // short page
		}
		return &Cursor{At: t0, RunID: fmt.Sprint(start + n)}, n, nil
	}}
}

func TestDrainSizedPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pass := sdk.Pass{Now: t0, Deadline: t0.Add(30 * time.Second)}

	t.Run("FirstPageIsThePageSize_ThenDrainPages", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		f := &sizedListing{name: "a", rows: 2500, perRow: 10 * time.Microsecond, clk: clk}
		st, _ := DecodeState(nil)
		stats, err := Drain(ctx, NewBudget(clk, pass, 0), st, f.listing())
		want := []int{ladder.PageSize, ladder.DrainPage, ladder.DrainPage, ladder.DrainPage}
		if err != nil || !stats.Exhausted || fmt.Sprint(f.limits) != fmt.Sprint(want) {
			t.Fatalf("stats %+v err %v limits %v, want %v", stats, err, f.limits, want)
		}
	})
	t.Run("NoDeadline_OnePageOfThePageSize", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		f := &sizedListing{name: "a", rows: 5000, perRow: time.Microsecond, clk: clk}
		st, _ := DecodeState(nil)
		Drain(ctx, NewBudget(clk, sdk.Pass{Now: t0}, 0), st, f.listing())
		if fmt.Sprint(f.limits) != fmt.Sprint([]int{ladder.PageSize}) || st.Cursors["a"].RunID != "100" {
			t.Fatalf("limits %v state %v", f.limits, st.Cursors)
		}
	})
	t.Run("PagesSizedToWhatTheBudgetFits", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		// 30ms a row: the first page takes 3s. With 27s left and 3s of
		// reserve, 24s fits 800 rows, 24s. After it 3s is left, less
		// than the slowest page and the reserve: the pass stops, before
		// its reserve.
		f := &sizedListing{name: "a", rows: 100_000, perRow: 30 * time.Millisecond, clk: clk}
		st, _ := DecodeState(nil)
		stats, err := Drain(ctx, NewBudget(clk, pass, 0), st, f.listing())
		want := []int{ladder.PageSize, 800}
		if err != nil || stats.Exhausted || fmt.Sprint(f.limits) != fmt.Sprint(want) || st.Cursors["a"].RunID != "900" {
			t.Fatalf("stats %+v err %v limits %v state %v, want %v", stats, err, f.limits, st.Cursors, want)
		}
		if clk.Now().Sub(t0) > 27*time.Second {
			t.Fatalf("the drain ran into its reserve: %v of 30s", clk.Now().Sub(t0))
		}
	})
	t.Run("SlowRows_StayAtThePageSize", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		// 100ms a row: 10s a page; what is left after it fits no more
		// than a page of 100.
		f := &sizedListing{name: "a", rows: 100_000, perRow: 100 * time.Millisecond, clk: clk}
		st, _ := DecodeState(nil)
		Drain(ctx, NewBudget(clk, pass, 0), st, f.listing())
		for _, l := range f.limits {
			if l != ladder.PageSize {
				t.Fatalf("limits %v, want pages of %d", f.limits, ladder.PageSize)
			}
		}
		if clk.Now().Sub(t0) > 30*time.Second {
			t.Fatalf("the drain overran its budget: %v of 30s", clk.Now().Sub(t0))
		}
	})
}

func TestDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pass := sdk.Pass{Now: t0, Deadline: t0.Add(30 * time.Second)}

	t.Run("DrainsToTheEndWithinBudget", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		f := &fakeListing{name: "a", rows: 2500, cost: time.Millisecond, clk: clk}
		st, _ := DecodeState(nil)
		stats, err := Drain(ctx, NewBudget(clk, pass, 0), st, f.listing())
		if err != nil || !stats.Exhausted || f.pages != 26 || len(st.Cursors) != 0 {
			t.Fatalf("stats %+v err %v pages %d state %v", stats, err, f.pages, st.Cursors)
		}
	})
	t.Run("BudgetSpent_CursorKeptForNextPass", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		// 4s a page against 30s: a page starts only while more than the
		// slowest page (4s) plus a tenth of the budget (3s) is left.
		f := &fakeListing{name: "a", rows: 10_000, cost: 4 * time.Second, clk: clk}
		st, _ := DecodeState(nil)
		stats, err := Drain(ctx, NewBudget(clk, pass, 0), st, f.listing())
		if err != nil || stats.Exhausted || f.pages != 6 || st.Cursors["a"].RunID != "600" {
			t.Fatalf("stats %+v err %v pages %d state %v", stats, err, f.pages, st.Cursors)
		}
		// The next pass goes on from there.
		f.pages = 0
		b, _ := st.Encode()
		st2, err := DecodeState(b)
		if err != nil {
			t.Fatal(err)
		}
		Drain(ctx, NewBudget(clk, sdk.Pass{Now: clk.Now(), Deadline: clk.Now().Add(30 * time.Second)}, 0), st2, f.listing())
		if st2.Cursors["a"].RunID != "1200" {
			t.Fatalf("second pass ended at %v", st2.Cursors)
		}
	})
	t.Run("NoDeadline_OnePagePerListing", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		a := &fakeListing{name: "a", rows: 1000, clk: clk}
		b := &fakeListing{name: "b", rows: 1000, clk: clk}
		st, _ := DecodeState(nil)
		Drain(ctx, NewBudget(clk, sdk.Pass{Now: t0}, 0), st, a.listing(), b.listing())
		if a.pages != 1 || b.pages != 1 {
			t.Fatalf("pages %d %d", a.pages, b.pages)
		}
	})
	t.Run("RoundRobin_NoListingStarves", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		big := &fakeListing{name: "big", rows: 100_000, cost: 4 * time.Second, clk: clk}
		small := &fakeListing{name: "small", rows: 250, cost: 4 * time.Second, clk: clk}
		st, _ := DecodeState(nil)
		Drain(ctx, NewBudget(clk, pass, 0), st, big.listing(), small.listing())
		if small.pages != 3 || big.pages != 3 {
			t.Fatalf("pages big=%d small=%d", big.pages, small.pages)
		}
	})
	t.Run("MaxPagesPerListing", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		a := &fakeListing{name: "a", rows: 1000, clk: clk}
		st, _ := DecodeState(nil)
		Drain(ctx, NewBudget(clk, pass, 2), st, a.listing())
		if a.pages != 2 || st.Cursors["a"].RunID != "200" {
			t.Fatalf("pages %d state %v", a.pages, st.Cursors)
		}
	})
	t.Run("ErrorKeepsTheFailingCursor", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		a := &fakeListing{name: "a", rows: 1000, clk: clk, fail: errors.New("boom")}
		st, _ := DecodeState([]byte(`{"v":1,"cursors":{"a":{"at":"2030-01-07T09:00:00Z","run":"300"}}}`))
		if _, err := Drain(ctx, NewBudget(clk, pass, 0), st, a.listing()); err == nil || !strings.Contains(err.Error(), "drain a: boom") {
			t.Fatalf("err %v", err)
		}
		if st.Cursors["a"].RunID != "300" {
			t.Fatalf("state %v", st.Cursors)
		}
	})
	t.Run("CanceledBeforeFirstPage_Error", func(t *testing.T) {
		t.Parallel()
		clk := clock.NewFake(t0)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		st, _ := DecodeState(nil)
		if _, err := Drain(cctx, NewBudget(clk, pass, 0), st, (&fakeListing{name: "a", clk: clk}).listing()); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
	})
}

func TestState(t *testing.T) {
	t.Parallel()
	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		st, _ := DecodeState(nil)
		st.set("silent", &Cursor{At: t0, RunID: "r", TaskID: "t"})
		b, err := st.Encode()
		if err != nil || !strings.Contains(string(b), `"v":1`) {
			t.Fatalf("%s %v", b, err)
		}
		back, err := DecodeState(b)
		if err != nil || *back.Candidate("silent") != (sdk.Cursor{At: t0, RunID: "r", TaskID: "t"}) || back.Candidate("other") != nil {
			t.Fatalf("%+v %v", back, err)
		}
		if rc := back.Run("silent"); rc == nil || rc.RunID != "r" {
			t.Fatalf("run cursor %+v", rc)
		}
	})
	t.Run("NotesRoundTripAndEmptyForgets", func(t *testing.T) {
		t.Parallel()
		st, _ := DecodeState(nil)
		st.SetNote("feed", "g.1 7")
		st.SetNote("gone", "")
		b, err := st.Encode()
		if err != nil || b == nil {
			t.Fatalf("a state with a note encoded %s %v", b, err)
		}
		back, err := DecodeState(b)
		if err != nil || back.Note("feed") != "g.1 7" || back.Note("gone") != "" {
			t.Fatalf("%+v %v", back, err)
		}
		back.SetNote("feed", "")
		if b, _ := back.Encode(); b != nil {
			t.Fatalf("a state whose last note was forgotten encoded %s", b)
		}
	})
	t.Run("EmptyEncodesNil", func(t *testing.T) {
		t.Parallel()
		st, _ := DecodeState(nil)
		if b, _ := st.Encode(); b != nil {
			t.Fatalf("%s", b)
		}
	})
	t.Run("CorruptOrOtherVersion_EmptyWithError", func(t *testing.T) {
		t.Parallel()
		for _, in := range []string{"{", `{"v":2,"cursors":{"a":{"run":"x"}}}`} {
			st, err := DecodeState([]byte(in))
			if err == nil || len(st.Cursors) != 0 {
				t.Fatalf("%s: %+v %v", in, st, err)
			}
		}
	})
}

func TestBrakeJudge(t *testing.T) {
	t.Parallel()
	b := Brake{Share: 0.5, Min: 20, Max: 10}
	for _, tc := range []struct {
		name                string
		judged, silenceOnly int
		engaged             bool
		allowed             int
	}{
		{"BelowMin_NeverEngaged", 19, 19, false, 19},
		{"AtShare_NotEngaged", 40, 20, false, 20},
		{"OverShare_Engaged", 40, 21, true, 10},
		{"OverShareUnderMax_AllAllowed", 20, 11, true, 10},
		{"NoSilenceOnly", 100, 0, false, 0},
		{"NothingJudged", 0, 0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := b.Judge(tc.judged, tc.silenceOnly)
			if v.Engaged != tc.engaged || v.Allowed != tc.allowed {
				t.Fatalf("%+v", v)
			}
		})
	}
	if v := (Brake{Share: 1, Min: 0, Max: 0}).Judge(10, 10); v.Engaged {
		t.Fatalf("share 1 engaged: %+v", v)
	}
}

type testConfig struct {
	PolicySetting
	DrainSetting
	Brake
}

func TestConfig(t *testing.T) {
	t.Parallel()
	defaults := testConfig{PolicySetting: DefaultPolicy(), Brake: DefaultBrake()}
	schema := sdk.SchemaOf(defaults)
	var names []string
	for _, a := range schema.Attributes {
		names = append(names, a.Name)
	}
	if got := strings.Join(names, ","); got != "policy,drain_max_pages,brake_share,brake_min,brake_max" {
		t.Fatalf("attributes %s", got)
	}
	cfg := defaults
	if err := (sdk.Values{}).Decode(&cfg); err != nil || cfg != defaults {
		t.Fatalf("%+v %v", cfg, err)
	}
	cfg = defaults
	err := sdk.Values{"brake_share": 0.25, "brake_min": 3.0, "brake_max": int64(4), "policy": "hold"}.Decode(&cfg)
	if err != nil || cfg.Brake != (Brake{Share: 0.25, Min: 3, Max: 4}) || !cfg.Hold() {
		t.Fatalf("%+v %v", cfg, err)
	}
	for _, tc := range []struct {
		values sdk.Values
		want   string
	}{
		{sdk.Values{"polcy": "hold"}, `attribute "polcy": not a setting of this plugin`},
		{sdk.Values{"policy": "keep"}, `attribute "policy": must be "replace" or "hold", got "keep"`},
		{sdk.Values{"brake_share": 1.5}, `attribute "brake_share": must be greater than 0 and at most 1, got 1.5`},
		{sdk.Values{"brake_min": 2.5}, `attribute "brake_min": must be a whole number, got 2.5`},
		{sdk.Values{"drain_max_pages": -1.0}, `attribute "drain_max_pages": must not be negative, got -1`},
		{sdk.Values{"policy": true}, `attribute "policy": must be a string, got bool`},
	} {
		cfg := defaults
		if err := tc.values.Decode(&cfg); err == nil || err.Error() != tc.want {
			t.Errorf("%v: err %v, want %s", tc.values, err, tc.want)
		}
	}
}

func TestTeardownTrouble(t *testing.T) {
	t.Parallel()
	failed, fallback, summary := TeardownTrouble([]sdk.TeardownOutcome{
		{Object: "pod/a", Action: sdk.TeardownSkipTerminal},
		{Object: "pod/b", Action: sdk.TeardownDeleteFallback},
	}, nil)
	if failed || !fallback || summary != "pod/a:skipped_terminal; pod/b:delete_fallback" {
		t.Fatalf("%v %v %q", failed, fallback, summary)
	}
	if failed, _, _ := TeardownTrouble(nil, errors.New("x")); !failed {
		t.Fatal("a call error is a failure")
	}
}

func TestRecorderHandsEveryDecisionToTheSink(t *testing.T) {
	ctx := context.Background()
	var sink sdk.Collector
	rec := NewRecorder("test", sdk.Pass{}, &sink)
	for i := range flushAt - 1 {
		rec.Add(sdk.LabelAgentLost, sdk.Attempt{RunID: "r", TaskID: fmt.Sprint(i), Try: 1}, true, "", Evidence{})
	}
	if err := rec.Flush(ctx); err != nil || len(sink.Decisions()) != 0 {
		t.Fatalf("flushed below the batch size: %d (%v)", len(sink.Decisions()), err)
	}
	rec.Add(sdk.LabelMarkNoop, sdk.Attempt{RunID: "r", TaskID: "last", Try: 1}, false, "", Evidence{})
	if err := rec.Flush(ctx); err != nil || len(sink.Decisions()) != flushAt {
		t.Fatalf("a full batch: %d in the sink (%v)", len(sink.Decisions()), err)
	}
	rec.Add(sdk.LabelAgentLost, sdk.Attempt{RunID: "r", TaskID: "after", Try: 1}, true, "", Evidence{})
	if err := rec.Close(ctx); err != nil || len(sink.Decisions()) != flushAt+1 {
		t.Fatalf("close: %d in the sink (%v)", len(sink.Decisions()), err)
	}
	if rec.Count(sdk.LabelAgentLost) != flushAt || rec.Count(sdk.LabelMarkNoop) != 1 {
		t.Fatalf("counts %d %d", rec.Count(sdk.LabelAgentLost), rec.Count(sdk.LabelMarkNoop))
	}
}
