package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/machinecpu"
	"github.com/dexaflow/reaper/testkit/massbench"
)

// The floor: two parts of the reaper's row measured alone, so that the
// table can say what the work the reaper must keep costs before any
// judgment, decision, evidence or guard beyond the plain update's. With
// the plain-SQL line (a listing and a guarded update of each page) they
// make the floor line.

// auditColumns are the audit row's columns as the board writes them.
const auditColumns = `at, term, reaper, label, run_id, task_id, try_number, attempt_epoch, applied, dry_run,
    detail, evidence_packed, scored, holder`

// measureAuditAlone writes again, alone, the audit rows the last recovery
// wrote: a copy of them is taken, the audit emptied, and the rows inserted
// from the copy in one statement (PostgreSQL's work for the row and its
// indexes; no client encodes anything). It returns the machine's CPU
// seconds over the insert (an average of floorReps inserts).
func measureAuditAlone(ctx context.Context, pool *pgxpool.Pool, n int) (float64, error) {
	for _, sql := range []string{
		"DROP TABLE IF EXISTS peer_audit_rows",
		"CREATE UNLOGGED TABLE peer_audit_rows AS SELECT " + auditColumns + " FROM reap_decisions",
		"TRUNCATE reap_decisions",
		"VACUUM ANALYZE peer_audit_rows, reap_decisions",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("the audit alone: %s: %w", sql, err)
		}
	}
	var total float64
	for rep := range floorReps(n) {
		if rep > 0 {
			if _, err := pool.Exec(ctx, "TRUNCATE reap_decisions"); err != nil {
				return 0, fmt.Errorf("the audit alone: %w", err)
			}
		}
		var written int64
		cpu, err := machinecpu.Measured(func() error {
			tag, err := pool.Exec(ctx, "INSERT INTO reap_decisions ("+auditColumns+") SELECT "+auditColumns+" FROM peer_audit_rows")
			written = tag.RowsAffected()
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("the audit alone: %w", err)
		}
		if written != int64(n) {
			return 0, fmt.Errorf("the audit alone: %d rows written, the recovery wrote %d", written, n)
		}
		total += cpu
	}
	return total / float64(floorReps(n)), nil
}

// floorReps is how many times a floor part is measured and averaged at n
// rows: enough for 100,000 rows in all, since the machine's CPU is read in
// steps of 10 ms and a part of 10,000 rows takes a few of them.
func floorReps(n int) int { return max(1, 100_000/n) }

// measureProbeAlone probes every attempt of the workload through the
// in-process Lite substrate, a drain page (ladder.DrainPage) at a time as
// the recovery asks, and checks each reads dead. It returns the machine's
// CPU seconds over the probes (an average of floorReps rounds).
func measureProbeAlone(ctx context.Context, w *massbench.Workload) (float64, error) {
	attempts := massbench.Attempts(w.N)
	cpu, err := machinecpu.Measured(func() error {
		for from := 0; from < floorReps(w.N)*len(attempts); from += ladder.DrainPage {
			from := from % len(attempts)
			page := attempts[from:min(from+ladder.DrainPage, len(attempts))]
			got, err := w.Lite.Liveness(ctx, sdk.LivenessRequest{Attempts: page, Now: massbench.Now})
			if err != nil {
				return fmt.Errorf("the probe alone: %w", err)
			}
			for _, l := range got {
				if l.State != sdk.Dead {
					return fmt.Errorf("the probe alone: %s reads %s, want dead", l.Attempt, l.State)
				}
			}
		}
		return nil
	})
	return cpu / float64(floorReps(w.N)), err
}

// printFloor prints the floor table: machine CPU a row of the plain-SQL
// listing and update (pages of 1,000), of the audit rows alone and of the
// probe alone, their sum against River's row, and what is left at the
// aim's 1.5 x River for everything else the reaper does, against what that
// costs today.
func printFloor(w io.Writer, rs []sizeResult) {
	fmt.Fprintln(w, "\nThe floor of the reaper's row: machine CPU µs a row of the work it must keep, each part alone.")
	fmt.Fprintln(w, "\n| part | "+sizeHeader(rs)+" |")
	fmt.Fprintln(w, "|---|"+strings.Repeat("---:|", len(rs)))
	line := func(name string, f func(sizeResult) float64) {
		cells := make([]string, len(rs))
		for i, r := range rs {
			cells[i] = fmt.Sprintf("%.1f", f(r)*1e6/float64(r.n))
		}
		fmt.Fprintf(w, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	floor := func(r sizeResult) float64 { return r.cpuPlain1000 + r.cpuAudit + r.cpuProbe }
	line("listing and guarded update (plain SQL, pages of 1,000)", func(r sizeResult) float64 { return r.cpuPlain1000 })
	line("the audit rows alone (the recovery's rows inserted again, PostgreSQL only)", func(r sizeResult) float64 { return r.cpuAudit })
	line("the Lite probe alone, as built (every attempt, pages of 1,000, in process)", func(r sizeResult) float64 { return r.cpuProbe })
	line("**floor**: their sum", floor)
	line("River's whole row", func(r sizeResult) float64 { return r.cpuRiver })
	line("left at 1.5 × River for everything else", func(r sizeResult) float64 { return 1.5*r.cpuRiver - floor(r) })
	line("everything else today (reaper in process − floor)", func(r sizeResult) float64 { return r.cpuIn - floor(r) })
}
