package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/testkit/history"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The failover's asynchronous mode. The failover is drawn once, as
// FaultFailover; its step's pick (a failover needs no target) decides its
// mode: an even pick fails over to the synchronous standby (nothing the
// primary acknowledged is lost), an odd one, on either edition, first makes
// the standby
// asynchronous and stops its streaming for a window drawn from the rest of
// the pick, while the system keeps writing to the primary, and the
// leading replica is killed as the window opens, so that a successor takes
// the next term on the primary alone. Then the primary is killed -9 and the
// standby promoted: everything the primary acknowledged in the window is
// lost (the leader row's term increments, marks, reports, runs submitted),
// and the promoted board hands a lost term's number out again.
//
// The standby is started synchronous and made asynchronous for the window
// (pgtest Desynchronize) rather than started asynchronous, so that the
// synchronous mode stays what it claims (every commit waited for the
// standby) and the window's start is exact: a commit acknowledged before it
// had reached the standby, one acknowledged after it may be lost. The
// fault records the window (Fault.LostFrom, LostTo), and the history says
// so (a fault event with lost_from, package testkit/history), so that the
// checker and the invariants excuse what the window legitimately lost, and
// nothing else.

// FaultFailoverAsync is the failover in its asynchronous mode, as recorded
// (drawn as FaultFailover).
const FaultFailoverAsync = "failover_to_async_standby"

// The asynchronous window's length is drawn in [lostMin, lostMax): at least
// the lease, so that the leader killed as it opens is succeeded on the
// primary, up to past the next term's settling grace.
const (
	lostMin = lease
	lostMax = lease + grace + 2*time.Second
)

// failoverMode is the failover's mode from its step's pick: asynchronous on
// an odd pick, with the window's length drawn from the rest of it.
func failoverMode(pick uint64) (async bool, window time.Duration) {
	if pick%2 == 0 {
		return false, 0
	}
	span := uint64((lostMax - lostMin) / time.Millisecond)
	return true, lostMin + time.Duration((pick/2)%span)*time.Millisecond
}

// lostWrites is what an asynchronous failover lost.
type lostWrites struct {
	// From is when the standby began to be made asynchronous (a commit
	// acknowledged before it had reached the standby) and To when the
	// primary had been killed.
	From, To time.Time
	// Rows are, by table, the rows the primary held, read just before its
	// kill, beyond what the standby held (a lower bound: the primary
	// wrote on until it died).
	Rows map[string]int64
	// Terms are the terms the primary's leader row began that the standby
	// never had.
	Terms []Term
}

// boardTables are the tables whose rows a failover may lose, counted.
var boardTables = []string{"fault_history_ti", "fault_history_run", "fault_history_leader", "fault_history_hb",
	"reap_decisions", "runs"}

// describe is the lost writes in a line.
func (lw lostWrites) describe() string {
	var parts []string
	for _, t := range boardTables {
		parts = append(parts, fmt.Sprintf("%s %d", t, lw.Rows[t]))
	}
	terms := "none"
	if len(lw.Terms) > 0 {
		var ts []string
		for _, t := range lw.Terms {
			ts = append(ts, fmt.Sprintf("%d (%s)", t.Term, t.Holder))
		}
		terms = strings.Join(ts, ", ")
	}
	return fmt.Sprintf("lost from %s to %s: rows %s; terms %s", stamp(lw.From), stamp(lw.To), strings.Join(parts, ", "), terms)
}

// failoverAsync makes the standby asynchronous and stops its streaming,
// calls opened (the window is open: the injector kills the leader), lets
// the primary write alone for window, kills it, waits detect and promotes
// the standby. The caller holds the database. It returns what was lost
// once the promoted server accepts writes; lw.From is set even on an error.
func (db *database) failoverAsync(ctx context.Context, now func() time.Time, window, detect time.Duration,
	opened func()) (lostWrites, error) {
	lw := lostWrites{Rows: map[string]int64{}}
	if db.standby == nil {
		return lw, errNoTarget
	}
	wctx := context.WithoutCancel(ctx)
	sctx, cancel := context.WithTimeout(wctx, 30*time.Second)
	defer cancel()
	lw.From = now()
	if err := db.standby.Desynchronize(sctx, db.primary); err != nil {
		return lw, err
	}
	if err := db.standby.StopStreaming(sctx); err != nil {
		return lw, err
	}
	opened()
	sleep(wctx, window-now().Sub(lw.From))
	// What each side holds: the standby's is fixed since it stopped.
	onStandby, standbyTerm, err := boardCounts(sctx, db.standby)
	if err != nil {
		return lw, fmt.Errorf("count the standby's rows: %w", err)
	}
	onPrimary, _, err := boardCounts(sctx, db.primary)
	if err != nil {
		return lw, fmt.Errorf("count the primary's rows: %w", err)
	}
	if lw.Terms, err = termsAbove(sctx, db.primary, standbyTerm); err != nil {
		return lw, fmt.Errorf("read the primary's terms: %w", err)
	}
	old := db.primary
	if err := old.Kill(); err != nil {
		return lw, err
	}
	lw.To = now() // dead by now: nothing it acknowledged is later
	db.dead = append(db.dead, old)
	for t, n := range onPrimary {
		lw.Rows[t] = n - onStandby[t]
	}
	sleep(wctx, detect)
	pctx, cancelPromote := context.WithTimeout(wctx, 90*time.Second)
	defer cancelPromote()
	if err := db.standby.Promote(pctx); err != nil {
		return lw, err
	}
	db.primary, db.standby = db.standby, nil
	return lw, nil
}

// boardCounts counts srv's rows of boardTables and reads its leader row's
// highest term.
func boardCounts(ctx context.Context, srv *pgtest.Server) (map[string]int64, int64, error) {
	conn, err := pgx.Connect(ctx, srv.DSN("reaper"))
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	out := map[string]int64{}
	for _, t := range boardTables {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
			return nil, 0, fmt.Errorf("count %s: %w", t, err)
		}
		out[t] = n
	}
	var term int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(term), 0) FROM leader").Scan(&term); err != nil {
		return nil, 0, fmt.Errorf("read the leader row: %w", err)
	}
	return out, term, nil
}

// termsAbove lists the terms srv's leader row began above term, in order.
func termsAbove(ctx context.Context, srv *pgtest.Server, term int64) ([]Term, error) {
	conn, err := pgx.Connect(ctx, srv.DSN("reaper"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT term, coalesce(holder, ''), at FROM fault_history_leader WHERE term > $1 ORDER BY id`, term)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Term
	for rows.Next() {
		var t Term
		if err := rows.Scan(&t.Term, &t.Holder, &t.At); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// forgetRead drops what the soak had read of the audit and the heartbeats
// (read on by row id): the promoted board lost some of those rows and may
// give their ids to new ones; the next reads take the promoted board's
// tables from the start.
func (s *soak) forgetRead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decisions, s.lastAudit = nil, 0
	s.heartbeats, s.lastBeat = nil, 0
	s.readGen++
}

// failOverAsync is the failover in its asynchronous mode (inject): the
// database taken, the window opened, the leader killed in it (a fault of
// its own, restarted after st.d1), the primary killed, the standby
// promoted st.d1 later. The fault is recorded as the window opens and
// given the window when the primary dies; once the standby is promoted the
// soak forgets what it had read of the lost writes.
func (in *injector) failOverAsync(ctx context.Context, st step, window time.Duration) (*Fault, error) {
	s := in.s
	if !s.db.acquire(ctx) {
		return nil, errNoTarget
	}
	defer s.db.release()
	if !s.db.canFailOver() {
		return nil, errNoTarget
	}
	f := in.record(Fault{Kind: FaultFailoverAsync, At: s.tl.now(),
		Detail: fmt.Sprintf("standby (port %d) made asynchronous and stopped streaming for %s, the leader killed in it; primary (port %d) killed -9, standby promoted after %s",
			s.db.standby.Port(), window.Round(time.Millisecond), s.db.primary.Port(), st.d1.Round(time.Millisecond))})
	lw, err := s.db.failoverAsync(ctx, s.tl.now, window, st.d1, func() {
		in.wg.Add(1)
		go func() { // a fault of its own, undone (the replica restarted) on its own
			defer in.wg.Done()
			if _, err := in.inject(ctx, step{kind: FaultLeaderKill, d1: st.d1}); err != nil {
				in.mu.Lock()
				in.skipped[FaultLeaderKill]++
				in.mu.Unlock()
			}
		}()
	})
	if !lw.To.IsZero() { // the primary died: what it held alone is lost
		in.mu.Lock()
		f.LostFrom, f.LostTo = lw.From, lw.To
		f.Detail += "; " + lw.describe()
		in.lost = append(in.lost, lw)
		in.mu.Unlock()
	}
	if err != nil {
		s.fail(Violation{Check: "harness", Evidence: "fail over postgres to the asynchronous standby: " + err.Error()})
	} else {
		s.forgetRead()
		s.logf("fault %-22s %s", FaultFailoverAsync, lw.describe())
	}
	in.ended(f)
	return f, nil
}

// ExcusedByLostWindow lists what the soak's invariants excused because an
// asynchronous failover lost it, each with its evidence.
func ExcusedByLostWindow(h History) []string {
	var out []string
	for _, e := range h.Executions {
		if h.lostRunning(e) {
			out = append(out, fmt.Sprintf("%s: agent %d told should_terminate at %s (started %s): the promoted board never had it running",
				e.Attempt, e.AgentPID, stamp(e.End), stamp(e.Start)))
		}
	}
	for _, ps := range h.PodStops {
		for _, e := range h.Executions {
			if e.Attempt == ps.Attempt && e.Start.Before(ps.At) && (e.Over().After(ps.At) || e.EndReason == agent.ReasonAgentStopped) &&
				h.lostPodStop(ps, e) {
				out = append(out, fmt.Sprintf("pod %s of %s %s at %s under its task (agent %d, started %s): the promoted board never had it running",
					ps.Pod, ps.Attempt, ps.How, stamp(ps.At), e.AgentPID, stamp(e.Start)))
			}
		}
	}
	return out
}

// lostRows writes, for each asynchronous failover, what it lost and what
// followed: the rows and terms lost, each lost term's number as the
// promoted board handed it out again, the fence's refusals from the
// promotion to a lease and a grace after it, and what the invariants and
// the checker excused.
func (s *soak) lostRows(h History, verdict history.Verdict, row func(k string, v any)) {
	s.inj.mu.Lock()
	lost := append([]lostWrites(nil), s.inj.lost...)
	s.inj.mu.Unlock()
	if len(lost) == 0 {
		return
	}
	s.mu.Lock()
	rises := append([]fenceRise(nil), s.fenceRises...)
	samples := append([]leaderSample(nil), s.leaderSamples...)
	s.mu.Unlock()
	sort.Slice(samples, func(i, j int) bool { return samples[i].At.Before(samples[j].At) })
	// The asynchronous failovers' figures, as the nemeses' table gives the
	// synchronous ones (both drawn as FaultFailover).
	async := h
	async.Faults = nil
	for _, f := range h.Faults {
		if f.Kind == FaultFailoverAsync {
			f.Kind = FaultFailover
			async.Faults = append(async.Faults, f)
		}
	}
	for _, nf := range MeasureNemeses(async, samples, rises, verdict.Violations) {
		if nf.Kind == FaultFailover {
			row(FaultFailoverAsync, fmt.Sprintf("thrown %d, fence refused %d, longest without a leader %s, recovery %s, checker violations %d",
				nf.Thrown, int(nf.Refused), nf.Leaderless.Round(100*time.Millisecond), spread(nf.Recovery), nf.Violations))
		}
	}
	for _, lw := range lost {
		var promoted time.Time
		for _, f := range h.Faults {
			if f.LostTo.Equal(lw.To) {
				promoted = f.Ended
			}
		}
		row(FaultFailoverAsync+": lost", lw.describe())
		var again []string
		for _, lt := range lw.Terms {
			for _, t := range h.Terms {
				if t.Term == lt.Term {
					again = append(again, fmt.Sprintf("term %d: %s on the lost primary, %s on the promoted board", lt.Term,
						lt.Holder, t.Holder))
				}
			}
		}
		if len(again) == 0 {
			again = []string{"none"}
		}
		row(FaultFailoverAsync+": terms handed out again", strings.Join(again, "; "))
		refused := 0.0
		for _, r := range rises {
			if !promoted.IsZero() && r.At.After(promoted) && !r.Since.After(promoted.Add(nemesisWindow)) {
				refused += r.Refused
			}
		}
		row(FaultFailoverAsync+": fence refusals after the promotion", int(refused))
	}
	ex := ExcusedByLostWindow(h)
	row("excused_by_lost_window (invariants)", strings.TrimSpace(fmt.Sprintf("%d %s", len(ex), strings.Join(ex, "; "))))
	row("excused_by_lost_window (checker)", verdict.ExcusedByLostWindow)
}
