package history_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/history"
)

// What a Writer records, Read reads back as it was, in the order it was
// recorded, and Check judges it as it judged the events themselves.
func TestWriterReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.history")
	hw, err := history.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	events := clean()
	// A write with every field a write has, and a time in another zone.
	full := sentAt(91, w(92, "settle", 2, "replica-2", att("a", 1, 1), "moved_on", "failed"))
	full.Next, full.Note = att("a", 2, 0), "late"
	full.Time = full.Time.In(time.FixedZone("east", 3*3600))
	events = append(events, full)
	for _, e := range events {
		if err := hw.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := hw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := hw.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if err := hw.Record(events[0]); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Record after Close: %v, want os.ErrClosed", err)
	}

	got, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(events) {
		t.Fatalf("read %d events, recorded %d", len(got), len(events))
	}
	for i := range events {
		if !got[i].Time.Equal(events[i].Time) || !got[i].Since.Equal(events[i].Since) {
			t.Errorf("event %d: times %v/%v, recorded %v/%v", i+1, got[i].Time, got[i].Since, events[i].Time, events[i].Since)
		}
		g, e := got[i], events[i]
		g.Time, g.Since, e.Time, e.Since = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !reflect.DeepEqual(g, e) {
			t.Errorf("event %d read back as\n%+v\nrecorded\n%+v", i+1, g, e)
		}
	}
	if a, b := history.Check(got).Summary(), history.Check(events).Summary(); a != b {
		t.Errorf("verdict on the file %q, on the events %q", a, b)
	}

	// Each line is one event, its time in RFC 3339 with nanoseconds; a
	// field an event does not carry is left out.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if len(lines) != len(events) {
		t.Fatalf("%d lines for %d events", len(lines), len(events))
	}
	const first = `{"time":"2025-03-04T05:06:07Z","kind":"exec_start","attempt":{"run_id":"run-1","task_id":"a","try":1,"epoch":0},"exec":"pod-a1"}`
	if lines[0] != first {
		t.Errorf("first line\n%s\nwant\n%s", lines[0], first)
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"time":"2025-03-04T08:06:07.092+03:00"`) || !strings.Contains(last, `"since":"2025-03-04T05:06:07.091Z"`) {
		t.Errorf("last line's times: %s", last)
	}
}

// Open appends: a second writer on the same file (another process, or a
// replica restarted) adds to what is there.
func TestOpenAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.history")
	for i := range 2 {
		hw, err := history.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := hw.Record(fault(i, fmt.Sprint("fault ", i))); err != nil {
			t.Fatal(err)
		}
		if err := hw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Note != "fault 0" || got[1].Note != "fault 1" {
		t.Errorf("read %+v", got)
	}
}

// Concurrent Records each land whole, on a line of their own.
func TestWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	hw := history.NewWriter(&buf)
	const goroutines, each = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				e := start(i, att(fmt.Sprint("task-", g), 1, 0), fmt.Sprintf("exec-%d-%d", g, i))
				if err := hw.Record(e); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := hw.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := history.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != goroutines*each {
		t.Fatalf("decoded %d events, recorded %d", len(got), goroutines*each)
	}
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.Exec] = true
	}
	if len(seen) != goroutines*each {
		t.Errorf("%d distinct executions, recorded %d", len(seen), goroutines*each)
	}
	// One goroutine's events keep its order.
	var order []int
	for _, e := range got {
		var g, i int
		if _, err := fmt.Sscanf(e.Exec, "exec-%d-%d", &g, &i); err != nil {
			t.Fatal(err)
		}
		if g == 0 {
			order = append(order, i)
		}
	}
	if !slices.IsSorted(order) {
		t.Errorf("one goroutine's events out of order: %v", order)
	}
}

func TestRecordRefusesAnEventItCannotPlace(t *testing.T) {
	hw := history.NewWriter(&bytes.Buffer{})
	for _, e := range []history.Event{
		{Kind: history.KindFault},
		{Time: at(1)},
	} {
		if err := hw.Record(e); err == nil {
			t.Errorf("recorded %+v", e)
		}
	}
}

type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errors.New("disk gone") }

func TestRecordWrapsTheWriteError(t *testing.T) {
	err := history.NewWriter(failing{}).Record(fault(1, "x"))
	if err == nil || !strings.Contains(err.Error(), "history: write fault event: disk gone") {
		t.Errorf("error %v", err)
	}
}

func TestDecode(t *testing.T) {
	good := `{"time":"2025-03-04T05:06:07Z","kind":"fault","note":"a"}`
	for _, tc := range []struct {
		name, in string
		n        int    // events, when it reads
		err      string // else the error says
	}{
		{name: "empty", in: "", n: 0},
		{name: "blank lines skipped", in: "\n" + good + "\n\n  \n" + good, n: 2},
		{name: "no final newline", in: good, n: 1},
		{name: "not JSON", in: good + "\n{\"time\":", err: "line 2"},
		{name: "a field the format lacks", in: good + "\n" + `{"time":"2025-03-04T05:06:07Z","kind":"write","trem":3}`, err: `line 2: json: unknown field "trem"`},
		{name: "a bad time", in: `{"time":"yesterday","kind":"fault"}`, err: "line 1"},
		{name: "two events on a line", in: good + " " + good, err: "line 1: more than one event"},
		{name: "a line too long", in: `{"note":"` + strings.Repeat("x", 1<<20) + `"}`, err: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := history.Decode(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "history: ") {
					t.Errorf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != tc.n {
				t.Errorf("%d events, %v; want %d", len(got), err, tc.n)
			}
		})
	}
}

func TestReadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.history")
	if err := os.WriteFile(path, []byte("nonsense\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := history.Read(path); err == nil || !strings.Contains(err.Error(), "history: read "+path+": line 1") {
		t.Errorf("error %v", err)
	}
	if _, err := history.Read(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
