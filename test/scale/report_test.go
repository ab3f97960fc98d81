package scale_test

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

// report is the run's table. It is the package's one piece of mutable
// state: TestMain sets it once, before any benchmark runs; the testing
// package offers no other way to hand a value from TestMain to them.
var report atomic.Pointer[table]

// TestMain starts the benchmarks' PostgreSQL only when benchmarks run (make
// test runs none here), and prints the table when they end.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	t := &table{start: time.Now()}
	report.Store(t)
	code := pgtest.Run(m)
	t.print(os.Stdout)
	os.Exit(code)
}

// table is what the benchmarks measured, in the order they measured it.
type table struct {
	start time.Time
	mu    sync.Mutex
	rows  []row
}

// row is one figure: its section (heartbeats, passes, audit ...), what it
// measures, its value, and the aim it is held to with whether it met it
// ("" when a figure has no aim).
type row struct {
	section, measure, value, aim, met string
}

// add records a figure. met is nil for a figure with no aim.
func add(section, measure, value, aim string, met *bool) {
	r := row{section: section, measure: measure, value: value, aim: aim}
	if met != nil {
		r.met = "no"
		if *met {
			r.met = "yes"
		}
	}
	t := report.Load()
	t.mu.Lock()
	t.rows = append(t.rows, r)
	t.mu.Unlock()
	progress("%s: %s = %s", section, measure, value)
}

// aimed adds a figure held to an aim.
func aimed(section, measure, value, aim string, met bool) { add(section, measure, value, aim, &met) }

// figure adds a figure without an aim.
func figure(section, measure, value string) { add(section, measure, value, "", nil) }

// progress prints one progress line with the time since the run began.
func progress(format string, args ...any) {
	start := report.Load().start
	fmt.Fprintf(os.Stderr, "scale %7s  %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
}

// print writes the table.
func (t *table) print(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfleet scale (%s, %s)\n", time.Since(t.start).Round(time.Second), machine())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "section\tmeasure\tvalue\taim\tmet")
	for _, r := range t.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.section, r.measure, r.value, r.aim, r.met)
	}
	_ = tw.Flush()
}

// machine names the machine's cores, for the table's title.
func machine() string { return fmt.Sprintf("%d cores", runtime.NumCPU()) }
