// Command peerbench measures the reaper's mass recovery side by side with
// its closest peer, River's JobRescuer, and with plain-SQL baselines, on one
// throwaway PostgreSQL, and prints one table of rows per second and ratios.
// make bench-peers runs it; see docs/performance.md for the method.
//
//	peerbench -bin DIR [-n 10000,100000] [-runs 3]
//
// DIR holds the plugin binaries (reaper-agentlost, reaper-substrate-lite)
// that make build writes. It is a module of its own so that River never
// becomes a dependency of the product.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peerbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binDir := fs.String("bin", "", "directory of the plugin binaries (make build writes bin/)")
	sizes := fs.String("n", "10000,100000", "comma-separated numbers of stuck rows")
	runs := fs.Int("runs", 3, "measured runs of each system per size (the table shows medians)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binDir == "" {
		return fmt.Errorf("-bin is required")
	}
	ns, err := parseSizes(*sizes)
	if err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "peerbench: "+format+"\n", a...) }

	progress("starting a throwaway PostgreSQL")
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return err
	}
	defer srv.Stop()
	tmp, err := os.MkdirTemp("", "peerbench-")
	if err != nil {
		return fmt.Errorf("make a work directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	var tables []sizeResult
	for _, n := range ns {
		res, err := measure(ctx, srv, tmp, *binDir, n, *runs, progress)
		if err != nil {
			return fmt.Errorf("%d rows: %w", n, err)
		}
		tables = append(tables, res)
	}
	printTable(stdout, tables, *runs)
	return nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-n: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// sizeResult is every system's medians at one size.
type sizeResult struct {
	n                       int
	river                   riverResult
	inProc, outProc         massbench.Recovery
	plain100, plain1000     time.Duration
	riverWork, riverTotal   time.Duration
	riverStartup, riverNaps time.Duration
	// The machine's CPU seconds over each system's run (medians; NaN when
	// unknown): every process, the database's included.
	cpuRiver, cpuIn, cpuOut, cpuPlain100, cpuPlain1000 float64
	// The floor's parts measured alone (floor.go): the recovery's audit
	// rows inserted again, and the Lite probe of every attempt.
	cpuAudit, cpuProbe float64
}

func newDB(ctx context.Context, srv *pgtest.Server, name string) (*pgxpool.Pool, error) {
	if err := srv.CreateDatabase(ctx, name, ""); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, srv.DSN(name))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	return pool, nil
}

// measure runs every system runs times over n stuck rows, interleaved (one
// run of each in turn), so that a busy machine weighs on all alike.
func measure(ctx context.Context, srv *pgtest.Server, tmp, binDir string, n, runs int, progress func(string, ...any)) (sizeResult, error) {
	res := sizeResult{n: n}
	progress("%d rows: seeding the reaper's board and %d dead attempts' records", n, n)
	reaperPool, err := newDB(ctx, srv, fmt.Sprintf("reaper_%d", n))
	if err != nil {
		return res, err
	}
	defer reaperPool.Close()
	if _, err := board.Migrate(ctx, reaperPool); err != nil {
		return res, fmt.Errorf("migrate the board: %w", err)
	}
	dir, err := os.MkdirTemp(tmp, "reaper-")
	if err != nil {
		return res, fmt.Errorf("make a record directory: %w", err)
	}
	w, err := massbench.NewWorkload(ctx, reaperPool, dir, n)
	if err != nil {
		return res, err
	}
	inProc, err := massbench.InProcess(ctx)
	if err != nil {
		return res, err
	}
	plugins, err := w.LaunchPlugins(ctx, binDir)
	if err != nil {
		return res, err
	}
	defer plugins.Close()

	progress("%d rows: making River's schema", n)
	riverPool, err := newDB(ctx, srv, fmt.Sprintf("river_%d", n))
	if err != nil {
		return res, err
	}
	defer riverPool.Close()
	if err := migrateRiver(ctx, riverPool); err != nil {
		return res, err
	}

	var (
		rivers          []riverResult
		ins, outs       []massbench.Recovery
		plain1, plain10 []time.Duration
		// The machine's CPU over each run, by system.
		cpuRiver, cpuIn, cpuOut, cpuPlain1, cpuPlain10 []float64
		cpuAudit, cpuProbe                             []float64
	)
	reset := func() error { return w.Board.Reset(ctx) }
	for r := 1; r <= runs; r++ {
		progress("%d rows, run %d/%d: River's rescuer", n, r, runs)
		if err := seedRiver(ctx, riverPool, n); err != nil {
			return res, err
		}
		rr, err := runRiver(ctx, riverPool, n)
		if err != nil {
			return res, err
		}
		cpuRiver = append(cpuRiver, rr.cpu) // over its work only: its waits are not counted
		rivers = append(rivers, rr)
		progress("%d rows, run %d/%d:   River work %s in %d batches (%.0f rows/s); start-up wait %s, sleeps %s",
			n, r, runs, rr.work.Round(time.Millisecond), rr.batches, rate(n, rr.work),
			rr.startup.Round(time.Millisecond), rr.sleeps.Round(time.Millisecond))

		for _, way := range []struct {
			name string
			into *[]massbench.Recovery
			cpu  *[]float64
			out  bool
		}{{"in process", &ins, &cpuIn, false}, {"out of process", &outs, &cpuOut, true}} {
			progress("%d rows, run %d/%d: the reaper, %s", n, r, runs, way.name)
			if err := reset(); err != nil {
				return res, err
			}
			var (
				reaper                = inProc
				exec   sdk.Executions = w.Lite
			)
			if way.out {
				reaper, exec = plugins.Reaper, plugins.Substrate
			}
			var rec massbench.Recovery
			cpu, err := machinecpu.Measured(func() (err error) {
				rec, err = w.Recover(ctx, reaper, exec)
				return err
			})
			if err != nil {
				return res, err
			}
			*way.into = append(*way.into, rec)
			*way.cpu = append(*way.cpu, cpu)
			progress("%d rows, run %d/%d:   %s in %d passes (%.0f rows/s; audit %s)", n, r, runs,
				rec.Elapsed.Round(time.Millisecond), rec.Passes, rate(n, rec.Elapsed), rec.Audit.Round(time.Millisecond))
		}

		progress("%d rows, run %d/%d: the floor: the audit rows alone, the probe alone", n, r, runs)
		acpu, err := measureAuditAlone(ctx, reaperPool, n)
		if err != nil {
			return res, err
		}
		pcpu, err := measureProbeAlone(ctx, w)
		if err != nil {
			return res, err
		}
		cpuAudit, cpuProbe = append(cpuAudit, acpu), append(cpuProbe, pcpu)

		for _, page := range []int{100, 1000} {
			progress("%d rows, run %d/%d: plain SQL, pages of %d", n, r, runs, page)
			if err := reset(); err != nil {
				return res, err
			}
			var (
				d      time.Duration
				marked int
			)
			cpu, err := machinecpu.Measured(func() (err error) {
				d, marked, err = runPlain(ctx, reaperPool, massbench.Now, page)
				return err
			})
			if err != nil {
				return res, err
			}
			if marked != n {
				return res, fmt.Errorf("plain SQL, pages of %d, marked %d of %d rows", page, marked, n)
			}
			if page == 100 {
				plain1, cpuPlain1 = append(plain1, d), append(cpuPlain1, cpu)
			} else {
				plain10, cpuPlain10 = append(plain10, d), append(cpuPlain10, cpu)
			}
			progress("%d rows, run %d/%d:   %s (%.0f rows/s)", n, r, runs, d.Round(time.Millisecond), rate(n, d))
		}
	}
	res.riverWork = median(rivers, func(r riverResult) time.Duration { return r.work })
	res.riverTotal = median(rivers, func(r riverResult) time.Duration { return r.total })
	res.riverStartup = median(rivers, func(r riverResult) time.Duration { return r.startup })
	res.riverNaps = median(rivers, func(r riverResult) time.Duration { return r.sleeps })
	res.river = rivers[0]
	res.inProc = ins[0]
	res.inProc.Elapsed = median(ins, func(r massbench.Recovery) time.Duration { return r.Elapsed })
	res.inProc.Audit = median(ins, func(r massbench.Recovery) time.Duration { return r.Audit })
	res.outProc = outs[0]
	res.outProc.Elapsed = median(outs, func(r massbench.Recovery) time.Duration { return r.Elapsed })
	res.outProc.Audit = median(outs, func(r massbench.Recovery) time.Duration { return r.Audit })
	res.plain100 = median(plain1, func(d time.Duration) time.Duration { return d })
	res.plain1000 = median(plain10, func(d time.Duration) time.Duration { return d })
	res.cpuRiver, res.cpuIn, res.cpuOut = medianCPU(cpuRiver), medianCPU(cpuIn), medianCPU(cpuOut)
	res.cpuPlain100, res.cpuPlain1000 = medianCPU(cpuPlain1), medianCPU(cpuPlain10)
	res.cpuAudit, res.cpuProbe = medianCPU(cpuAudit), medianCPU(cpuProbe)
	return res, nil
}

func median[T any](xs []T, f func(T) time.Duration) time.Duration {
	ds := make([]time.Duration, len(xs))
	for i, x := range xs {
		ds[i] = f(x)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// printTable prints the one table: every system at every size, its rows per
// second over its work, and the ratios the reaper is judged by.
func printTable(w io.Writer, rs []sizeResult, runs int) {
	fmt.Fprintf(w, "\nPeer benchmark: medians of %d interleaved runs; rows/s = stuck rows / time of the system's work.\n\n", runs)
	fmt.Fprintln(w, "| system | rows | work | rows/s | / River work | machine CPU µs/row | cores busy |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		river := rate(r.n, r.riverWork)
		row := func(name string, d time.Duration, cpu float64) {
			perRow, cores := cpuCells(r.n, cpu, d)
			fmt.Fprintf(w, "| %s | %d | %s | %.0f | %.2f | %s | %s |\n", name, r.n, d.Round(time.Millisecond),
				rate(r.n, d), rate(r.n, d)/river, perRow, cores)
		}
		row("River JobRescuer, its work (fetch + decide + update)", r.riverWork, r.cpuRiver)
		row(fmt.Sprintf("River JobRescuer, end to end (start-up wait %s, sleeps %s, %d batches of up to %d)",
			r.riverStartup.Round(time.Millisecond), r.riverNaps.Round(time.Millisecond), r.river.batches, r.river.batchMax),
			r.riverTotal, r.cpuRiver)
		row(fmt.Sprintf("reaper agentlost, in process (%d passes; audit %s)", r.inProc.Passes, r.inProc.Audit.Round(time.Millisecond)), r.inProc.Elapsed, r.cpuIn)
		row(fmt.Sprintf("reaper agentlost, out of process (%d passes; audit %s)", r.outProc.Passes, r.outProc.Audit.Round(time.Millisecond)), r.outProc.Elapsed, r.cpuOut)
		row("plain SQL, keyset pages of 100 + guarded update per page", r.plain100, r.cpuPlain100)
		row("plain SQL, keyset pages of 1,000 + guarded update per page", r.plain1000, r.cpuPlain1000)
	}
	fmt.Fprintln(w, "\nmachine CPU: the whole machine's busy time (its own process, the database's, everything) over the")
	fmt.Fprintln(w, "system's work (River's: from each fetch's start to its update's end), per row, read from /proc/stat")
	fmt.Fprintln(w, "in steps of 10 ms; cores busy: that time over the work's (River's end to end: over the whole run).")
	fmt.Fprintln(w, "\n| ratio | "+sizeHeader(rs)+" | aim |")
	fmt.Fprintln(w, "|---|"+strings.Repeat("---:|", len(rs))+"---|")
	ratio := func(name, aim string, f func(sizeResult) float64) {
		cells := make([]string, len(rs))
		for i, r := range rs {
			cells[i] = fmt.Sprintf("%.2f", f(r))
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", name, strings.Join(cells, " | "), aim)
	}
	ratio("reaper in process / River work", "≥ 1.0", func(r sizeResult) float64 { return r.riverWork.Seconds() / r.inProc.Elapsed.Seconds() })
	ratio("reaper out of process / River work", "≥ 0.9", func(r sizeResult) float64 { return r.riverWork.Seconds() / r.outProc.Elapsed.Seconds() })
	ratio("reaper in process / plain SQL page 100", "≥ 0.7", func(r sizeResult) float64 { return r.plain100.Seconds() / r.inProc.Elapsed.Seconds() })
	ratio("plugin overhead (out / in, time)", "≤ 1.2", func(r sizeResult) float64 { return r.outProc.Elapsed.Seconds() / r.inProc.Elapsed.Seconds() })
	ratio("machine CPU a row, reaper in process / River work", "≤ 1.5", func(r sizeResult) float64 { return r.cpuIn / r.cpuRiver })
	printFloor(w, rs)
	fmt.Fprint(w, perRow)
}

func sizeHeader(rs []sizeResult) string {
	cells := make([]string, len(rs))
	for i, r := range rs {
		cells[i] = strconv.Itoa(r.n)
	}
	return strings.Join(cells, " | ")
}

// perRow says what each side does for each stuck row.
const perRow = `
What each side does per row:
  River:   reads the whole job row (keyset by id, batches of 10,000); decodes its metadata, builds its
           work unit and decodes its args, decides retry or discard and when; encodes an error JSON;
           one UPDATE ... FROM unnest per batch guarded on the row still running, appending the error.
           No liveness probe, no fencing on a leadership term, no audit row.
  reaper:  reads the candidate (keyset over the heartbeat index: a first page of 100, then pages of up
           to 1,000 while the budget fits them); a positive liveness probe
           (the agent's and the task group's records, each process checked against its start time);
           the judgment and its decision with evidence; the guarded mark (run, task, try, epoch, source
           state, heartbeat not since the threshold, the term still leading with its lease unexpired);
           one audit row with its evidence packed. Out of process: the reaper and the substrate are
           plugin binaries over go-plugin (gRPC), the board and the sink served by the host.
           Both ways run as reaperd does: the decisions streamed to the audit and let go once
           written, the host's process at the GC target reaperd sets (400, unless GOGC is set).
  GC:      River and plain SQL run at the runtime's default GC target (100), as an application
           embedding River does unless it sets its own.
  plain:   keyset page over the same index, one UPDATE ... FROM unnest per page guarded on the attempt
           and its state; nothing else.
`
