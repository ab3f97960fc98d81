package reapers_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/massbench"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// massSizes are the backlogs BenchmarkMassRecovery recovers.
var massSizes = []int{10_000, 100_000}

// newWorkload seeds n dead Lite attempts on a fresh board.
func newWorkload(b *testing.B, n int) *massbench.Workload {
	b.Helper()
	w, err := massbench.NewWorkload(context.Background(), pgtest.NewDB(b), b.TempDir(), n)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkMassRecovery marks 10,000, then 100,000, running Lite attempts
// whose agents and task groups are dead (a host lost with everything on it)
// with agentlost passes of a 30s budget, each pass's decisions written to
// the audit as the host writes them (massbench.Workload.Recover), three ways
// in each iteration, one after the other so that a busy machine weighs on
// all three alike:
//
//   - in_process: agentlost.New over board.Store and lite.New;
//   - plugin: the real reaper-agentlost binary over go-plugin, the host
//     serving the board and the in-process substrate over the broker;
//   - plugin_full: the substrate out of process too (reaper-substrate-lite),
//     as reaperd runs them.
//
// It reports the most passes any recovery needed, the in-process marks per
// second, each way's median time per recovery, the in-process wait for the
// audit after the passes (the rest of it runs beside them), and the median
// of the per-iteration ratios of the plugin ways to the in-process one.
func BenchmarkMassRecovery(b *testing.B) {
	for _, n := range massSizes {
		b.Run(fmt.Sprintf("Dead%dk", n/1000), func(b *testing.B) { benchMassRecovery(b, n) })
	}
}

func benchMassRecovery(b *testing.B, n int) {
	ctx := context.Background()
	w := newWorkload(b, n)
	inProc, err := massbench.InProcess(ctx)
	if err != nil {
		b.Fatal(err)
	}
	plugins, err := w.LaunchPlugins(ctx, binDir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(plugins.Close)

	ways := []struct {
		name   string
		reaper sdk.Reaper
		exec   sdk.Executions
	}{
		{"in_process", inProc, w.Lite},
		{"plugin", plugins.Reaper, w.Lite},
		{"plugin_full", plugins.Reaper, plugins.Substrate},
	}
	times := make([][]time.Duration, len(ways))
	ratios := make([][]float64, len(ways))
	var audit []time.Duration
	maxPasses := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, way := range ways {
			b.StopTimer()
			if err := w.Board.Reset(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			rec, err := w.Recover(ctx, way.reaper, way.exec)
			if err != nil {
				b.Fatalf("%s: %v", way.name, err)
			}
			maxPasses = max(maxPasses, rec.Passes)
			times[k] = append(times[k], rec.Elapsed)
			ratios[k] = append(ratios[k], rec.Elapsed.Seconds()/times[0][i].Seconds())
			if k == 0 {
				audit = append(audit, rec.Audit)
			}
		}
	}
	b.ReportMetric(float64(maxPasses), "passes")
	b.ReportMetric(float64(n)/median(times[0]).Seconds(), "marks/s")
	b.ReportMetric(float64(median(audit).Microseconds())/1000, "audit_ms")
	for k, way := range ways {
		b.ReportMetric(float64(median(times[k]).Microseconds())/1000, way.name+"_ms")
		if k > 0 {
			b.ReportMetric(medianFloat(ratios[k]), "x_"+way.name)
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianFloat(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSteadyState runs one reap pass of the three Lite reapers
// (dispatchlost, agentlost, orphanrun, in that order, in-process) over a
// board of healthy running attempts with fresh heartbeats and nothing to
// reap: 10,000 of them, then 100,000, ten to a run. It reports the median
// time of the whole pass and of each reaper's part and, over 100,000, the
// ratio of each median to its median over 10,000: the cost of a pass must
// not grow with the healthy population.
func BenchmarkSteadyState(b *testing.B) {
	ctx := context.Background()
	sub, err := massbench.NewLite(ctx, filepath.Join(b.TempDir(), "records"))
	if err != nil {
		b.Fatal(err)
	}
	reapers := []sdk.Reaper{dispatchlost.New(nil), agentlost.New(nil), orphanrun.New(nil)}
	names := []string{dispatchlost.Name, agentlost.Name, orphanrun.Name}
	for _, r := range reapers {
		if err := r.Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: sdk.Values{},
			Ladder: ladder.Defaults()}); err != nil {
			b.Fatal(err)
		}
	}
	sizes := []int{10_000, 100_000}
	boards := map[int]*massbench.Board{}
	for _, n := range sizes {
		bb, err := massbench.NewBoard(ctx, pgtest.NewDB(b))
		if err != nil {
			b.Fatal(err)
		}
		if err := bb.SeedRunning(ctx, n, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		boards[n] = bb
	}

	// medians[n][0] is the whole pass; medians[n][1+i] reaper i's part.
	medians := map[int][]time.Duration{}
	for _, n := range sizes {
		bb := boards[n]
		b.Run(fmt.Sprintf("Healthy%dk", n/1000), func(b *testing.B) {
			l := ladder.Defaults()
			pass := sdk.Pass{Now: massbench.Now, Ladder: l, Term: bb.Term, Deadline: massbench.Now.Add(l.MaintenanceInterval),
				Edition: ladder.EditionLite}
			times := make([][]time.Duration, 1+len(reapers))
			for i := 0; i < b.N; i++ {
				var whole time.Duration
				for j, r := range reapers {
					start := time.Now()
					var sink sdk.Collector
					_, err := r.Reap(ctx, pass, bb.Store, sub, &sink)
					d := time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					if ds := sink.Decisions(); len(ds) != 0 {
						b.Fatalf("a healthy board gave %d decisions, the first %+v", len(ds), ds[0])
					}
					times[1+j] = append(times[1+j], d)
					whole += d
				}
				times[0] = append(times[0], whole)
			}
			ms := make([]time.Duration, len(times))
			for k := range times {
				ms[k] = median(times[k])
			}
			medians[n] = ms
			base, compare := medians[sizes[0]], n != sizes[0]
			report := func(k int, name string) {
				b.ReportMetric(float64(ms[k].Microseconds())/1000, name+"_ms")
				if compare && base != nil {
					b.ReportMetric(ms[k].Seconds()/base[k].Seconds(), "x_10k_"+name)
				}
			}
			report(0, "median")
			for j, name := range names {
				report(1+j, name)
			}
		})
	}
}
