package soak

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/history"
)

// What the nemeses cost the cluster: the soak looks at the leader row and
// at the replicas' fence counters more often than it judges, so that each
// partition, freeze and failover can be given its own figures.

// leaderEvery is how often the soak reads the leader row, and fenceEvery
// how often it scrapes the replicas' fence counters, while it runs.
const (
	leaderEvery = 200 * time.Millisecond
	fenceEvery  = time.Second
)

// leaderSample is one look at the leader row: whether a replica held an
// unexpired lease then (false too when the row could not be read: the
// database down, frozen or failing over).
type leaderSample struct {
	At   time.Time
	Held bool
}

// fenceRise is an increase of a replica's fence counter seen by a scrape:
// Refused more refusals, made after Since and by At.
type fenceRise struct {
	Since, At time.Time
	Refused   float64
}

// watchNemeses reads the leader row every leaderEvery and the fence
// counters every fenceEvery until ctx ends.
func (s *soak) watchNemeses(ctx context.Context) {
	tick := time.NewTicker(leaderEvery)
	defer tick.Stop()
	lastScrape := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.sampleLeader(ctx)
		if time.Since(lastScrape) >= fenceEvery {
			lastScrape = time.Now()
			s.fenceCounts(ctx)
		}
	}
}

func (s *soak) sampleLeader(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, leaderEvery)
	defer cancel()
	l, ok, err := s.store.CurrentLeader(ctx)
	held := err == nil && ok && l.Held(time.Now())
	s.mu.Lock()
	s.leaderSamples = append(s.leaderSamples, leaderSample{At: s.tl.now(), Held: held})
	s.mu.Unlock()
}

// gap is a time without a leader the soak saw: from the first sample
// without one to the next sample with one (or the last sample).
type gap struct{ From, To time.Time }

func (g gap) len() time.Duration { return g.To.Sub(g.From) }

// leaderGaps are the times without a leader in samples (in order), after
// the first leader (the start's election is no gap).
func leaderGaps(samples []leaderSample) []gap {
	var out []gap
	var open *gap
	led := false
	for _, sm := range samples {
		led = led || sm.Held
		switch {
		case !led:
		case !sm.Held && open == nil:
			open = &gap{From: sm.At, To: sm.At}
		case !sm.Held:
			open.To = sm.At
		case open != nil:
			open.To = sm.At
			out = append(out, *open)
			open = nil
		}
	}
	if open != nil {
		out = append(out, *open)
	}
	return out
}

// NemesisFigures are one nemesis kind's figures over a soak.
type NemesisFigures struct {
	Kind   string
	Thrown int
	// Refused is the fence's refusals scraped in the faults' windows (a
	// lower bound: a replica killed between scrapes loses its count).
	Refused float64
	// Leaderless is the longest time without a leader that began while
	// one of the faults lasted or within a lease of its end.
	Leaderless time.Duration
	// Recovery is, per fault, from its end (heal, thaw, promotion) until
	// a leader holds the lease and the board has applied a fenced write
	// since the end.
	Recovery []time.Duration
	// Violations are the checker's violations placed in the windows.
	Violations int
}

// nemesisWindow is how long after a fault ends its effects are counted
// as its own: a lease to run out and the next term's settling grace.
const nemesisWindow = lease + grace

// MeasureNemeses gives each nemesis kind its figures: the faults of that
// kind in h, the leader samples, the fence rises and the checker's
// violations, each counted in the windows [fault, its end +
// nemesisWindow] (a gap without a leader by when it began). Overlapping
// windows share what falls in both.
func MeasureNemeses(h History, samples []leaderSample, rises []fenceRise, vs []history.Violation) []NemesisFigures {
	gaps := leaderGaps(samples)
	var out []NemesisFigures
	for _, kind := range slices.Concat(nemeses, kubeNemeses) {
		nf := NemesisFigures{Kind: kind}
		for _, f := range h.Faults {
			if f.Kind != kind {
				continue
			}
			nf.Thrown++
			end := f.Ended
			if end.Before(f.At) {
				end = f.At // still under way at the last look
			}
			from, to := f.At, end.Add(nemesisWindow)
			for _, g := range gaps {
				// A gap it caused begins while it lasts, or as the lease
				// it kept from being renewed runs out.
				if !g.From.Before(from.Add(-leaderEvery)) && !g.From.After(end.Add(lease)) {
					nf.Leaderless = max(nf.Leaderless, g.len())
				}
			}
			for _, r := range rises {
				if r.At.After(from) && !r.Since.After(to) {
					nf.Refused += r.Refused
				}
			}
			for _, v := range vs {
				if !v.At.Before(from) && !v.At.After(to) {
					nf.Violations++
				}
			}
			led, ok1 := firstHeld(samples, end)
			wrote, ok2 := firstFencedWrite(h, end)
			if ok1 && ok2 {
				nf.Recovery = append(nf.Recovery, max(led.Sub(end), wrote.Sub(end)))
			}
		}
		out = append(out, nf)
	}
	return out
}

// firstHeld is the first sample at or after t that saw a leader.
func firstHeld(samples []leaderSample, t time.Time) (time.Time, bool) {
	for _, sm := range samples {
		if sm.Held && !sm.At.Before(t) {
			return sm.At, true
		}
	}
	return time.Time{}, false
}

// firstFencedWrite is the first fenced write the board applied after t.
func firstFencedWrite(h History, t time.Time) (time.Time, bool) {
	var first time.Time
	for _, tr := range h.Transitions {
		if tr.Fenced && tr.At.After(t) && (first.IsZero() || tr.At.Before(first)) {
			first = tr.At
		}
	}
	for _, rc := range h.RunChanges {
		if rc.Fenced && rc.At.After(t) && (first.IsZero() || rc.At.Before(first)) {
			first = rc.At
		}
	}
	return first, !first.IsZero()
}

// nemesisRows writes the nemeses' figures into the report.
func (s *soak) nemesisRows(h History, verdict history.Verdict, row func(k string, v any)) {
	s.mu.Lock()
	samples := append([]leaderSample(nil), s.leaderSamples...)
	rises := append([]fenceRise(nil), s.fenceRises...)
	nv := len(s.violations)
	s.mu.Unlock()
	sort.Slice(samples, func(i, j int) bool { return samples[i].At.Before(samples[j].At) })
	for _, nf := range MeasureNemeses(h, samples, rises, verdict.Violations) {
		if !slices.ContainsFunc(s.inj.weights, func(w faultWeight) bool { return w.kind == nf.Kind }) {
			continue // not in this edition's draw
		}
		row(nf.Kind, fmt.Sprintf("thrown %d, fence refused %d, longest without a leader %s, recovery %s, checker violations %d",
			nf.Thrown, int(nf.Refused), nf.Leaderless.Round(100*time.Millisecond), spread(nf.Recovery), nf.Violations))
	}
	s.lostRows(h, verdict, row)
	var longest time.Duration
	for _, g := range leaderGaps(samples) {
		longest = max(longest, g.len())
	}
	row("longest without a leader, whole soak", longest.Round(100*time.Millisecond))
	row("violations, whole soak (invariants and checker)", nv)
}

// The seed replays the injector's whole schedule, the nemeses included:
// the same seed draws the same steps, the failover at most once, and the
// partitions and freezes fall on both sides of the lease.
func TestInjectorDrawReplaysTheNemeses(t *testing.T) {
	const n = 2000
	draws := func(seed uint64) []step {
		in := newInjector(&soak{seed: seed}, faultWeights)
		out := make([]step, n)
		for i := range out {
			out[i] = in.next()
		}
		return out
	}
	for _, seed := range []uint64{1, 42, 0xfeedface} {
		a, b := draws(seed), draws(seed)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two injectors drew different schedules", seed)
		}
		if reflect.DeepEqual(a, draws(seed+1)) {
			t.Errorf("seed %d and %d drew the same schedule", seed, seed+1)
		}
		kinds := map[string]int{}
		var cutShort, cutLong, freezeShort, freezeLong bool
		for _, st := range a {
			kinds[st.kind]++
			switch st.kind {
			case FaultPartition:
				cutShort, cutLong = cutShort || st.dCut < lease, cutLong || st.dCut > lease
			case FaultFreeze:
				freezeShort, freezeLong = freezeShort || st.dFreeze < lease, freezeLong || st.dFreeze > lease
			}
		}
		if kinds[FaultFailover] != 1 {
			t.Errorf("seed %d: the failover drawn %d times in %d steps, want once", seed, kinds[FaultFailover], n)
		}
		for _, k := range []string{FaultPartition, FaultFreeze, FaultPostgres, FaultLeaderKill} {
			if kinds[k] == 0 {
				t.Errorf("seed %d: %s never drawn in %d steps", seed, k, n)
			}
		}
		if !cutShort || !cutLong || !freezeShort || !freezeLong {
			t.Errorf("seed %d: partitions shorter/longer than the lease %t/%t, freezes %t/%t; want both sides",
				seed, cutShort, cutLong, freezeShort, freezeLong)
		}
	}
	// The kube editions draw the Lite nemeses and the partition from the
	// API server, the real node the teardown refused past the valve too;
	// Lite draws neither of the kube ones.
	for name, c := range map[string]struct {
		ws         []faultWeight
		want, none []string
	}{
		"lite":   {faultWeights, nemeses, kubeNemeses},
		"player": {kubeFaultWeights, append(slices.Clone(nemeses), FaultAPIPartition), []string{FaultTeardownRefused}},
		"real":   {realFaultWeights, slices.Concat(nemeses, kubeNemeses), nil},
	} {
		in := newInjector(&soak{seed: 7}, c.ws)
		kinds := map[string]int{}
		for range n {
			kinds[in.next().kind]++
		}
		for _, k := range c.want {
			if kinds[k] == 0 || (once[k] && kinds[k] != 1) {
				t.Errorf("%s: %s drawn %d times in %d steps", name, k, kinds[k], n)
			}
		}
		for _, k := range c.none {
			if kinds[k] != 0 {
				t.Errorf("%s: %s drawn %d times, want never", name, k, kinds[k])
			}
		}
	}
}

// A partition cuts the leader's replica on an even pick and the drawn
// slot on an odd one.
func TestPartitionTarget(t *testing.T) {
	s := &soak{daemons: []*daemon{{slot: 1}, {slot: 2}, {slot: 3}}}
	in := newInjector(s, faultWeights)
	for pick, want := range map[uint64]int{1: 1, 3: 2, 5: 3, 7: 1} {
		slot, how, ok := in.partitionTarget(pick)
		if !ok || slot != want || how != "drawn" {
			t.Errorf("pick %d: slot %d (%s, %t), want %d drawn", pick, slot, how, ok, want)
		}
	}
}

// A replica's connection string names its own proxies, in the servers'
// order, the rest kept.
func TestWithPorts(t *testing.T) {
	dsn := "host=127.0.0.1,127.0.0.1 port=5432,5433 user=reaper password=x dbname=reaper sslmode=disable target_session_attrs=read-write"
	got := withPorts(dsn, []string{"4001", "4002"})
	want := "host=127.0.0.1,127.0.0.1 port=4001,4002 user=reaper password=x dbname=reaper sslmode=disable target_session_attrs=read-write"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// Each nemesis is given the leaderless time, the fence refusals, the
// recovery and the violations of its own windows.
func TestMeasureNemeses(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	h := History{
		Faults: []Fault{
			{Kind: FaultPartition, At: at(10), Ended: at(15)},
			{Kind: FaultFreeze, At: at(100), Ended: at(104)},
			{Kind: FaultPostgres, At: at(200), Ended: at(201)},
		},
		Transitions: []Transition{
			{At: at(16), Fenced: false},
			{At: at(17), Fenced: true},
			{At: at(105), Fenced: true},
		},
	}
	var samples []leaderSample
	for s := 0.0; s < 300; s += 0.5 {
		held := !(s >= 12 && s < 18) && !(s >= 100 && s < 103) && !(s >= 200 && s < 230)
		samples = append(samples, leaderSample{At: at(s), Held: held})
	}
	rises := []fenceRise{{Since: at(14), At: at(16), Refused: 3}, {Since: at(150), At: at(151), Refused: 9}}
	vs := []history.Violation{{At: at(101)}}
	got := map[string]NemesisFigures{}
	for _, nf := range MeasureNemeses(h, samples, rises, vs) {
		got[nf.Kind] = nf
	}
	p, f, fo := got[FaultPartition], got[FaultFreeze], got[FaultFailover]
	if p.Thrown != 1 || p.Refused != 3 || p.Leaderless != 6*time.Second || p.Violations != 0 ||
		!reflect.DeepEqual(p.Recovery, []time.Duration{3 * time.Second}) {
		t.Errorf("partition: %+v", p)
	}
	if f.Thrown != 1 || f.Refused != 0 || f.Leaderless != 3*time.Second || f.Violations != 1 ||
		!reflect.DeepEqual(f.Recovery, []time.Duration{time.Second}) {
		t.Errorf("freeze: %+v", f)
	}
	if fo.Thrown != 0 || fo.Leaderless != 0 || len(fo.Recovery) != 0 {
		t.Errorf("failover: %+v", fo)
	}
	// The start's election is no gap.
	if gs := leaderGaps([]leaderSample{{At: at(0)}, {At: at(1), Held: true}, {At: at(2)}, {At: at(3), Held: true}}); len(gs) != 1 ||
		gs[0].len() != time.Second {
		t.Errorf("gaps %+v, want one of 1s", gs)
	}
}
