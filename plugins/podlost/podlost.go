// Package podlost is the pod-lost reaper (kube edition): a running attempt
// whose pod is gone is failed on the infra rail as pod_lost.
//
// The listing holds the kube attempts in running that entered running more
// than pod_lost_floor ago (the floor is applied by the board, before the
// page limit), oldest first, a page of 100 at a time with the keyset cursor
// kept between passes, drained within the phase budget. Warm-pool attempts
// are not listed: they run in a warm worker's pod, not a pod of their own
// (the warmworker reaper judges them).
//
// Each page's attempts are put to the substrate in one liveness read. The
// kube substrate answers a cached Pending or Running pod with no API call
// and reads every other attempt live; it never answers "dead" from its
// cache. An attempt is marked only when the read says it has no pod object
// at all: a finished or unreachable pod is still present (its outcome is
// the reconciler's), and a read error defers (pod_lost_pod_query_error).
// The mark is provisional (the sweep confirms it, or the valve opens). Every
// mark rests on a positive signal, so the mass-reap brake never holds one
// back.
//
// The marked attempts' pods are torn down after the pass's marks, not
// between them: a teardown costs an API read of its own, and a lost node
// pool must not wait for thousands of them before its last attempt is
// marked. Teardowns run while the phase budget lasts; those it leaves are
// carried in the pass state and done first by the next pass. A teardown
// that fails is recorded as pod_lost_pod_delete_error and never undoes the
// mark.
//
// A present pod is the normal case and makes no decision, so a pass over a
// healthy fleet records nothing; the one exception is an attempt running
// past the floor that never heartbeated, whose present pod is recorded as
// pod_lost_pod_present (the window before the first heartbeat is this
// reaper's, not agentlost's).
//
// Such an attempt whose pods are all on a node that has not been Ready for
// longer than node_unreachable_after (the substrate reads the node's Ready
// condition, and since when, for pods whose own status hints at a lost
// node) is recorded as pod_lost_node_unreachable instead, naming the node
// and since when: it is wedged until someone acts, because its container
// may still run there and nothing will fail it. The operator confirms the
// machine is off and lets the cluster delete the pods (the out-of-service
// taint); with no pod object left, the attempt is marked pod_lost as any
// other. A node that could not be read defers as pod_lost_pod_query_error.
package podlost

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
)

// Name is the label the reaper is configured under.
const Name = "podlost"

// The listings of a pass (each one's cursor is kept in the pass state).
const (
	listRunning = "running" // the full walk: every running attempt past the floor
	listCrossed = "crossed" // the attempts that crossed the floor since the horizon
	listGone    = "gone"    // the attempts whose pods the change feed saw deleted
)

// The notes a pass leaves the next one (reap.State.Notes).
const (
	// noteFeed is the change feed's cursor, "<generation> <seq>": every
	// deletion before it has been looked at, or is covered by a full walk.
	noteFeed = "feed"
	// noteHorizon (RFC 3339): every attempt that entered running before
	// it has been judged since the feed cursor's position.
	noteHorizon = "horizon"
	// noteWalked (RFC 3339): when the last full walk ended.
	noteWalked = "walked"
)

// FullWalkEveryDefault is how often, at most, a steady pass walks every
// running attempt past the floor, whatever the change feed says.
const FullWalkEveryDefault = 10 * time.Minute

// NodeUnreachableAfterDefault is how long a node must have been not Ready
// before an attempt wedged on it is said to be (pod_lost_node_unreachable).
// Five minutes is the cluster's own patience: the node lifecycle controller
// has already waited its grace period (about 40-50 s) before it turned the
// node Unknown, and five minutes is the toleration the API server gives
// every pod for an unreachable node before the taint manager evicts it
// (DefaultTolerationSeconds). A kubelet restart or a network blip heals well
// inside it; past it, only an operator can end the wait.
const NodeUnreachableAfterDefault = 5 * time.Minute

// Config is the reaper's configuration block.
type Config struct {
	reap.PolicySetting
	reap.DrainSetting
	FullWalkEvery        time.Duration `reaper:"full_walk_every" help:"the longest a pass may go on the substrate's change feed alone before it walks every running attempt past the floor again (a backstop for a deletion the feed missed); \"0s\": walk every pass"`
	NodeUnreachableAfter time.Duration `reaper:"node_unreachable_after" help:"how long the node of a never-heartbeated attempt's pods must have been not Ready before the attempt is recorded as pod_lost_node_unreachable (it is deferred either way, never failed); must be positive"`
}

// DefaultConfig is the configuration of a block that sets nothing.
func DefaultConfig() Config {
	return Config{PolicySetting: reap.DefaultPolicy(), FullWalkEvery: FullWalkEveryDefault,
		NodeUnreachableAfter: NodeUnreachableAfterDefault}
}

// Validate checks what the embedded settings do not (they validate
// themselves).
func (c Config) Validate() error {
	if c.FullWalkEvery < 0 {
		return fmt.Errorf("full_walk_every: %s is negative", c.FullWalkEvery)
	}
	if c.NodeUnreachableAfter <= 0 {
		return fmt.Errorf("node_unreachable_after: %s is not positive", c.NodeUnreachableAfter)
	}
	return nil
}

// Reaper is the pod-lost reaper. Its zero value is not usable; call New.
type Reaper struct{ *reap.Base[Config] }

// New returns the reaper with its default configuration. A nil logger
// discards.
func New(logger hclog.Logger) *Reaper {
	return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, Editions: []string{ladder.EditionKube}, MarkReasons: []string{sdk.LabelPodLost},
		DecisionLabels: []string{sdk.LabelPodLostPodQueryErr, sdk.LabelPodLostPodDeleteErr, sdk.LabelPodLostPodPresent,
			sdk.LabelPodLostNodeUnreachable},
		KillLabels: []string{sdk.LabelPodLost}, ProvisionalLabels: []string{sdk.LabelPodLost},
		Description: "fails running attempts that have no pod left (pod_lost)"})}
}

// Reap runs one pass: one decision per attempt marked or deferred, plus
// one per teardown that failed or fell back. The pass is a full walk or,
// in the steady state, an incremental one (see plan).
func (r *Reaper) Reap(ctx context.Context, pass sdk.Pass, board sdk.Board, exec sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	p := &passRun{log: r.Logger(), cfg: r.Config(), pass: pass, board: board, exec: exec,
		rec: reap.NewRecorder(Name, pass, sink), watch: r.Stopwatch(), started: r.Stopwatch().Now(),
		cutoff: pass.Now.Add(-pass.Ladder.PodLostFloor), ended: map[string]bool{}}
	st := reap.LoadState(pass, r.Logger())
	p.teardowns = st.TakeOwed(owedTeardown)
	p.gone = st.TakeOwed(owedGone)
	listings := p.plan(ctx, st)
	return reap.Run(ctx, pass, p.rec, reap.Spec{
		Name: Name, Logger: r.Logger(), Stopwatch: r.Stopwatch(), MaxPages: p.cfg.MaxPages,
		Listings: listings,
		Finish:   p.tearDown,
		State:    st,
		Save:     p.save,
	})
}

var _ sdk.Reaper = (*Reaper)(nil)

// What a pass owes the next one, by kind in the pass state.
const (
	// owedTeardown: marked attempts whose teardown a pass did not get to.
	owedTeardown = "teardown"
	// owedGone: attempts the change feed named that a pass did not get to.
	owedGone = "gone"
)

// query is the listing of running kube attempts past the floor.
func (p *passRun) query() sdk.CandidateQuery {
	return sdk.CandidateQuery{States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorKube},
		OrderBy: sdk.FieldRunningAt, OlderThan: p.cutoff}
}

// plan reads the substrate's change feed, before any listing, and chooses
// the pass's listings.
//
// A full walk lists every running attempt past the floor (over as many
// passes as its pages need). It is what a pass does without a usable feed:
// the substrate has none, the feed's answer is not complete (the cache
// relisted, lost its watch, restarted or dropped changes since the saved
// cursor), the state holds no cursor or horizon (a first pass, a state
// lost), or full_walk_every has passed since the last walk ended. The feed
// cursor saved is the one read before the walk's first page, so that a
// deletion during a walk of several passes is still looked at after it.
//
// Otherwise the pass is incremental: it lists the attempts that crossed
// the floor since the horizon (the cutoff of the last pass that looked at
// all of them, less one maintenance interval, so that a row written late
// is looked at once more), and the attempts whose pods the feed saw
// deleted since the saved cursor, looked up on the board by name. Each is
// judged exactly as a full walk judges it.
func (p *passRun) plan(ctx context.Context, st *reap.State) []reap.Listing {
	full := []reap.Listing{p.track(reap.Candidates(listRunning, p.board, p.query(), p.judgePage))}
	feed, ok := p.exec.(sdk.ChangeFeed)
	if !ok || p.cfg.FullWalkEvery <= 0 {
		p.full(st, nil, "no change feed, or full_walk_every is 0s")
		return full
	}
	since, _ := decodeFeed(st.Note(noteFeed))
	ch, err := feed.Changes(ctx, since)
	if err != nil {
		p.log.Debug("full walk: the change feed could not be read", "error", err)
		p.full(st, nil, err.Error())
		return full
	}
	if _, walking := st.Cursors[listRunning]; walking {
		p.mode = "full walk, continued"
		p.gone = nil
		return full // the saved cursor stays the one read before the walk began
	}
	horizon, okH := parseTime(st.Note(noteHorizon))
	walked, okW := parseTime(st.Note(noteWalked))
	switch {
	case !ch.Complete:
		p.full(st, &ch.Cursor, ch.Detail)
		return full
	case !okH || !okW || since.Generation == "":
		p.full(st, &ch.Cursor, "no horizon or feed cursor in the pass state")
		return full
	case p.pass.Now.Before(walked) || p.pass.Now.Sub(walked) >= p.cfg.FullWalkEvery:
		p.full(st, &ch.Cursor, "full_walk_every has passed since the last walk")
		return full
	}
	p.mode = "incremental"
	st.SetNote(noteFeed, encodeFeed(ch.Cursor))
	p.gone = appendNew(p.gone, ch.Gone)
	if _, ok := st.Cursors[listCrossed]; !ok {
		st.Cursors[listCrossed] = reap.Cursor{At: horizon.Add(-p.pass.Ladder.MaintenanceInterval)}
	}
	ls := []reap.Listing{p.track(reap.Candidates(listCrossed, p.board, p.query(), p.judgePage))}
	delete(st.Cursors, listGone)
	if len(p.gone) > 0 {
		ls = append(ls, reap.Listing{Name: listGone, Page: p.gonePage})
	}
	return ls
}

// full starts a full walk from the oldest row, saving the feed cursor read
// before it (none: the next pass walks again).
func (p *passRun) full(st *reap.State, at *sdk.FeedCursor, why string) {
	p.mode = "full walk: " + why
	p.gone = nil // the walk looks at them all
	delete(st.Cursors, listCrossed)
	st.SetNote(noteHorizon, "")
	st.SetNote(noteFeed, "")
	if at != nil {
		st.SetNote(noteFeed, encodeFeed(*at))
	}
}

// track notes when listing l reads its last page. A drain reads the board
// in pages as large as its budget fits (up to ladder.DrainPage: a full walk
// over 150,000 attempts is 150 round trips, not 1,500), and judgePage reads
// their liveness ladder.PageSize at a time: a read's cache misses are live
// reads against the API server, and 100 at a time is what bounds them.
func (p *passRun) track(l reap.Listing) reap.Listing {
	page := l.Sized
	l.Sized = func(ctx context.Context, after *reap.Cursor, limit int) (*reap.Cursor, int, error) {
		cur, rows, err := page(ctx, after, limit)
		if err == nil && cur == nil {
			p.ended[l.Name] = true
		}
		return cur, rows, err
	}
	return l
}

// gonePage looks up the next (up to) 100 attempts the feed named, keeps
// those still running at the same try and epoch and past the floor, and
// judges them. An attempt not yet past the floor is left to the crossed
// listing, which reaches it when it crosses.
func (p *passRun) gonePage(ctx context.Context, _ *reap.Cursor) (*reap.Cursor, error) {
	n := min(len(p.gone), ladder.PageSize)
	q := p.query()
	q.Only, q.Limit = p.gone[:n], ladder.PageSize
	page, err := p.board.ListCandidates(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("list candidates named by the change feed: %w", err)
	}
	named := make(map[sdk.Attempt]bool, n)
	for _, a := range p.gone[:n] {
		named[a] = true
	}
	var same []sdk.Candidate
	for _, c := range page.Candidates {
		if named[c.Attempt] {
			same = append(same, c)
		}
	}
	if err := p.judgePage(ctx, same); err != nil {
		return nil, err
	}
	p.gone = p.gone[n:]
	if len(p.gone) == 0 {
		return nil, nil
	}
	return &reap.Cursor{}, nil // more to read; the position is p.gone
}

// save leaves the next pass its notes and what it owes.
func (p *passRun) save(st *reap.State, _ reap.DrainStats) {
	for _, a := range p.teardowns {
		st.Owe(owedTeardown, a)
	}
	for _, a := range p.gone {
		st.Owe(owedGone, a)
	}
	delete(st.Cursors, listGone)
	switch {
	case st.Note(noteFeed) == "":
		// No feed to go on: the notes would not be used.
		st.SetNote(noteWalked, "")
		st.SetNote(noteHorizon, "")
	case p.ended[listRunning]:
		st.SetNote(noteWalked, p.pass.Now.Format(time.RFC3339Nano))
		st.SetNote(noteHorizon, p.cutoff.Format(time.RFC3339Nano))
	case p.ended[listCrossed]:
		st.SetNote(noteHorizon, p.cutoff.Format(time.RFC3339Nano))
	}
	p.log.Debug("pass planned", "mode", p.mode)
}

func encodeFeed(c sdk.FeedCursor) string {
	return c.Generation + " " + strconv.FormatUint(c.Seq, 10)
}

// decodeFeed reads a saved feed cursor; a malformed one is the zero cursor
// (the feed then answers incomplete, and the pass walks).
func decodeFeed(s string) (sdk.FeedCursor, bool) {
	gen, seq, ok := strings.Cut(s, " ")
	if !ok {
		return sdk.FeedCursor{}, false
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return sdk.FeedCursor{}, false
	}
	return sdk.FeedCursor{Generation: gen, Seq: n}, true
}

func parseTime(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

// appendNew appends to have the attempts of add it does not hold yet.
func appendNew(have, add []sdk.Attempt) []sdk.Attempt {
	seen := make(map[sdk.Attempt]bool, len(have))
	for _, a := range have {
		seen[a] = true
	}
	for _, a := range add {
		if !seen[a] {
			seen[a] = true
			have = append(have, a)
		}
	}
	return have
}

type passRun struct {
	log   hclog.Logger
	cfg   Config
	pass  sdk.Pass
	board sdk.Board
	exec  sdk.Executions
	rec   *reap.Recorder

	watch   clock.Clock
	started time.Time
	// cutoff: the floor's bound of this pass (entered running before it).
	cutoff time.Time
	// mode says which listings the pass chose, and why (the pass log).
	mode string
	// gone: attempts the change feed named, still to be looked at.
	gone []sdk.Attempt
	// ended: the listings that read their last page this pass.
	ended map[string]bool
	// teardowns: marked attempts whose pods are still to be torn down,
	// those owed by earlier passes first.
	teardowns []sdk.Attempt
	// podUIDs: the pod UID each marked attempt records, which pins its
	// teardown to that pod (an attempt owed by an earlier pass has none
	// here: the label rule).
	podUIDs map[sdk.Attempt]string
}

// judgePage reads the page's pods in one call, judges each attempt, then
// marks and tears down the lost ones.
func (p *passRun) judgePage(ctx context.Context, page []sdk.Candidate) error {
	for chunk := range slices.Chunk(page, ladder.PageSize) {
		if err := p.judgeChunk(ctx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// judgeChunk judges at most ladder.PageSize candidates of a page: one
// liveness read, then the marks of those found gone.
func (p *passRun) judgeChunk(ctx context.Context, page []sdk.Candidate) error {
	attempts := make([]sdk.Attempt, len(page))
	for i, c := range page {
		attempts[i] = c.Attempt
	}
	answers := reap.ReadLivenessEach(ctx, p.exec, p.pass.Now, attempts, reap.RecordedPodUIDs(page), false)
	var planned []reap.Planned
	for i, c := range page {
		live := answers[i]
		j := judge(c, p.pass.Now, p.pass.Ladder, p.cfg.NodeUnreachableAfter, live)
		if j.act == actNone {
			continue
		}
		ev := reap.CandidateEvidence(p.pass, c, p.pass.Ladder.PodLostFloor).Liveness(live)
		if j.label == sdk.LabelPodLostNodeUnreachable {
			ev[evNodeUnreachableFor] = p.pass.Now.Sub(live.NodeUnreachableSince).Round(time.Second).String()
			ev[evNodeUnreachableAfter] = p.cfg.NodeUnreachableAfter.String()
		}
		if j.act == actDefer {
			p.rec.Add(j.label, c.Attempt, false, j.detail, ev)
			continue
		}
		ev[reap.EvMark] = sdk.LabelPodLost
		ev[reap.EvSignal] = reap.SignalPositive
		ev[reap.EvPolicy] = string(p.cfg.Policy)
		planned = append(planned, reap.Planned{
			Mark: sdk.Mark{
				Attempt:    c.Attempt,
				FromStates: []string{sdk.StateRunning},
				Kind:       sdk.MarkInfra,
				Reason:     sdk.LabelPodLost,
				Message:    sdk.LabelPodLost + ": " + j.detail,
				Hold:       p.cfg.Hold(),
				Term:       p.pass.Term,
				At:         p.pass.Now,
			},
			Label: j.label, Detail: j.detail, Evidence: ev,
		})
	}
	return reap.Settle(ctx, p.board, p.rec, planned, p.afterMark)
}

// afterMark queues the marked attempt's teardown for the end of the pass.
func (p *passRun) afterMark(_ context.Context, pl *reap.Planned) []reap.FollowUp {
	p.teardowns = append(p.teardowns, pl.Mark.Attempt)
	if uid := pl.Evidence[reap.EvPodUID]; uid != "" {
		if p.podUIDs == nil {
			p.podUIDs = map[sdk.Attempt]string{}
		}
		p.podUIDs[pl.Mark.Attempt] = uid
	}
	pl.Evidence[reap.EvTeardown] = "after the pass's marks"
	return nil
}

// tearDown tears down exactly each marked attempt's pod (normally there is
// none; one created since the read belongs to an attempt that is now
// failed) while the phase budget lasts, keeping a tenth of it in hand, and
// leaves the rest to the next pass. A failure is recorded against the
// attempt; its mark stays.
func (p *passRun) tearDown(ctx context.Context, _ reap.DrainStats) error {
	if p.pass.DryRun {
		return nil // a dry run stops nothing; what is owed stays owed
	}
	done := 0
	for _, a := range p.teardowns {
		if ctx.Err() != nil || !p.timeLeft() {
			break
		}
		ev := reap.Evidence{reap.EvTerm: strconv.FormatInt(p.pass.Term, 10), reap.EvEdition: p.pass.Edition,
			reap.EvMark: sdk.LabelPodLost}
		if uid := p.podUIDs[a]; uid != "" {
			ev[reap.EvPodUID] = uid
		}
		for _, f := range reap.TeardownAttempt(ctx, p.exec, p.pass, a, sdk.LabelPodLost, sdk.LabelPodLostPodDeleteErr, ev) {
			p.rec.Add(f.Label, a, f.Applied, f.Detail, f.Evidence)
		}
		done++
	}
	p.teardowns = p.teardowns[done:]
	if len(p.teardowns) > 0 {
		p.log.Info("teardowns left to the next pass: the phase budget is spent", "done", done, "left", len(p.teardowns))
	}
	return p.rec.Flush(ctx)
}

// timeLeft reports whether another teardown may start: more than a tenth of
// the phase budget is left (always, for a pass without a deadline).
func (p *passRun) timeLeft() bool {
	if p.pass.Deadline.IsZero() {
		return true
	}
	total := p.pass.Deadline.Sub(p.pass.Now)
	return p.watch.Now().Sub(p.started) < total-total/10
}

// Evidence of pod_lost_node_unreachable, beside the node and since when
// (reap.EvNode, reap.EvNodeUnreachableSince).
const (
	evNodeUnreachableFor   = "node_unreachable_for"
	evNodeUnreachableAfter = "node_unreachable_after"
)

type action int

const (
	actNone  action = iota // healthy, or not this reaper's yet: no decision
	actDefer               // leave it, say why
	actMark                // mark it pod_lost
)

type judgment struct {
	act    action
	label  string
	detail string
}

// judge is the policy for one listed attempt, given the substrate's answer
// about its pods and how long a node must have been not Ready before an
// attempt wedged on it is said to be.
//
// A present pod of an attempt that never heartbeated defers: as
// pod_lost_node_unreachable when every pod of it is on a node not Ready for
// longer than unreachableAfter (its container may still run: nothing is
// failed), as pod_lost_pod_query_error when that node could not be read,
// and as pod_lost_pod_present otherwise.
func judge(c sdk.Candidate, now time.Time, l ladder.Ladder, unreachableAfter time.Duration, live reap.Answer) judgment {
	if c.RunningAt.IsZero() || now.Sub(c.RunningAt) <= l.PodLostFloor {
		return judgment{act: actNone}
	}
	running := now.Sub(c.RunningAt).Round(time.Millisecond)
	switch {
	case live.Unknown():
		return judgment{act: actDefer, label: sdk.LabelPodLostPodQueryErr, detail: live.Why()}
	case live.State == sdk.Alive && c.LastHeartbeatAt.IsZero() && live.NodeError != "":
		return judgment{act: actDefer, label: sdk.LabelPodLostPodQueryErr,
			detail: fmt.Sprintf("running for %s without a heartbeat, its pod present, but its node could not be read: %s",
				running, live.NodeError)}
	case live.State == sdk.Alive && c.LastHeartbeatAt.IsZero() && nodeUnreachable(live, now, unreachableAfter):
		return judgment{act: actDefer, label: sdk.LabelPodLostNodeUnreachable,
			detail: fmt.Sprintf("running for %s without a heartbeat; its pods are on node %s, not Ready since %s (%s, past %s): "+
				"the container may still run there, so nothing is failed until the pods are gone; %s",
				running, live.Node, live.NodeUnreachableSince.UTC().Format(time.RFC3339),
				now.Sub(live.NodeUnreachableSince).Round(time.Second), unreachableAfter, live.Why())}
	case live.State == sdk.Alive && c.LastHeartbeatAt.IsZero():
		return judgment{act: actDefer, label: sdk.LabelPodLostPodPresent,
			detail: fmt.Sprintf("running for %s without a heartbeat, but %s", running, live.Why())}
	case live.State == sdk.Alive:
		return judgment{act: actNone}
	}
	return judgment{act: actMark, label: sdk.LabelPodLost,
		detail: fmt.Sprintf("running for %s (floor %s); no pod of the attempt", running, l.PodLostFloor)}
}

// nodeUnreachable: the substrate named a not-Ready node for every pod of
// the attempt, not Ready for longer than after.
func nodeUnreachable(live reap.Answer, now time.Time, after time.Duration) bool {
	return live.Node != "" && !live.NodeUnreachableSince.IsZero() && now.Sub(live.NodeUnreachableSince) > after
}
