package ctl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
)

// ShadowWindowDefault is the window reaperctl shadow summarises unless
// -window says: a week, the span of a calibration.
const ShadowWindowDefault = 7 * 24 * time.Hour

// unscored is the column of decisions with no verdict yet.
const unscored = "unscored"

// shadowColumns are the verdict columns, in the order told.
var shadowColumns = []string{sdk.VerdictWouldHaveKilledLiveWork, sdk.VerdictRight, sdk.VerdictUnresolved, unscored}

type shadowJSON struct {
	Since         time.Time          `json:"since"`
	WindowSeconds float64            `json:"window_seconds"`
	Truncated     bool               `json:"truncated"`
	Reapers       []shadowReaperJSON `json:"reapers"`
}

type shadowReaperJSON struct {
	Reaper string            `json:"reaper"`
	Labels []shadowLabelJSON `json:"labels"`
	// Precision over every label of the reaper; nil when nothing is
	// scored right or would-have-killed yet.
	Precision *float64 `json:"precision"`
	// Recall: RightAttempts / (RightAttempts + MissedAttempts); nil when
	// neither counts anything.
	Recall         *float64 `json:"recall"`
	RightAttempts  int      `json:"right_attempts"`
	MissedAttempts int      `json:"missed_attempts"`
	// Missed names the missed attempts (with -v).
	Missed []shadowAttemptJSON `json:"missed,omitempty"`
}

type shadowLabelJSON struct {
	Label string `json:"label"`
	// Decisions and Attempts count by verdict (and "unscored").
	Decisions map[string]int `json:"decisions"`
	Attempts  map[string]int `json:"attempts"`
	Precision *float64       `json:"precision"`
	// Behind names, by verdict, the attempts and decisions counted (with -v).
	Behind map[string][]shadowAttemptJSON `json:"behind,omitempty"`
}

type shadowAttemptJSON struct {
	RunID     string    `json:"run_id"`
	TaskID    string    `json:"task_id"`
	Try       int32     `json:"try_number"`
	Epoch     int32     `json:"attempt_epoch"`
	Reaper    string    `json:"reaper,omitempty"` // a missed attempt: the reaper whose mark settled it
	Label     string    `json:"label,omitempty"`
	Decisions int       `json:"decisions"`
	FirstID   int64     `json:"first_decision_id"`
	LastID    int64     `json:"last_decision_id"`
	FirstAt   time.Time `json:"first_at"`
	LastAt    time.Time `json:"last_at"`
}

func attemptOfGroup(g board.ShadowGroup) shadowAttemptJSON {
	return shadowAttemptJSON{RunID: g.RunID, TaskID: g.TaskID, Try: g.Try, Epoch: g.Epoch, Decisions: g.Count,
		FirstID: g.FirstID, LastID: g.LastID, FirstAt: g.FirstAt.UTC(), LastAt: g.LastAt.UTC()}
}

func (c CLI) shadow(ctx context.Context, inv *invocation) error {
	fs := inv.flags()
	window := fs.Duration("window", ShadowWindowDefault, "summarise the decisions made within `D` before now")
	only := fs.String("reaper", "", "only the reaper `NAME`")
	verbose := fs.Bool("v", false, "name the attempts and decisions behind every number")
	output := inv.outputFlag()
	if _, err := inv.parse(0, 0); err != nil {
		return err
	}
	if *window <= 0 {
		return usagef("-window %s: must be positive", *window)
	}
	if err := output(); err != nil {
		return err
	}
	s, err := c.open(ctx, inv.configPath)
	if err != nil {
		return err
	}
	defer s.close()
	since := c.now().Add(-*window)
	groups, truncated, err := s.store.ShadowDecisions(ctx, since)
	if err != nil {
		return err
	}
	doc := summariseShadow(groups, *only, *verbose)
	doc.Since, doc.WindowSeconds, doc.Truncated = since.UTC(), window.Seconds(), truncated
	if inv.json {
		return writeJSON(inv.stdout, doc)
	}
	return shadowTable(inv.stdout, doc, *verbose)
}

// summariseShadow counts the scored decisions of each reaper and label by
// verdict, and each reaper's recall: of the attempts settled lost in the
// window, how many it flagged. An attempt counts as lost when it is right
// by one of the reaper's own decisions, or when another reaper's applied
// mark failed it and that mark was not later found to have killed live
// work (a durable SUCCESS over it); it is missed when the reaper made no
// scored decision about it.
func summariseShadow(groups []board.ShadowGroup, only string, verbose bool) shadowJSON {
	doc := shadowJSON{Reapers: []shadowReaperJSON{}}
	type key struct{ reaper, label string }
	var (
		reapers  []string
		labels   = map[string][]string{}
		counts   = map[key]*shadowLabelJSON{}
		seen     = map[key]map[string]map[sdk.Attempt]bool{}
		flagged  = map[string]map[sdk.Attempt]bool{} // by reaper: attempts it made a scored decision about
		right    = map[string]map[sdk.Attempt]bool{}
		lostBy   = map[sdk.Attempt][]board.ShadowGroup{} // applied marks that stood
		liveWork = map[sdk.Attempt]bool{}                // applied marks found to have killed live work
	)
	for _, g := range groups {
		if g.Applied && g.Verdict != sdk.VerdictWouldHaveKilledLiveWork {
			lostBy[g.Attempt] = append(lostBy[g.Attempt], g)
		}
		if g.Applied && g.Verdict == sdk.VerdictWouldHaveKilledLiveWork {
			liveWork[g.Attempt] = true
		}
		if !g.Scored || only != "" && g.Reaper != only {
			continue
		}
		k := key{g.Reaper, g.Label}
		l, ok := counts[k]
		if !ok {
			if _, known := labels[g.Reaper]; !known {
				reapers = append(reapers, g.Reaper)
				flagged[g.Reaper], right[g.Reaper] = map[sdk.Attempt]bool{}, map[sdk.Attempt]bool{}
			}
			labels[g.Reaper] = append(labels[g.Reaper], g.Label)
			l = &shadowLabelJSON{Label: g.Label, Decisions: map[string]int{}, Attempts: map[string]int{}}
			if verbose {
				l.Behind = map[string][]shadowAttemptJSON{}
			}
			counts[k], seen[k] = l, map[string]map[sdk.Attempt]bool{}
		}
		col := g.Verdict
		if col == "" {
			col = unscored
		}
		l.Decisions[col] += g.Count
		if seen[k][col] == nil {
			seen[k][col] = map[sdk.Attempt]bool{}
		}
		if !seen[k][col][g.Attempt] {
			seen[k][col][g.Attempt] = true
			l.Attempts[col]++
		}
		if verbose {
			l.Behind[col] = append(l.Behind[col], attemptOfGroup(g))
		}
		flagged[g.Reaper][g.Attempt] = true
		if g.Verdict == sdk.VerdictRight {
			right[g.Reaper][g.Attempt] = true
		}
	}
	sort.Strings(reapers)
	for _, r := range reapers {
		rj := shadowReaperJSON{Reaper: r, Labels: []shadowLabelJSON{}}
		var ok, wrong int
		sort.Strings(labels[r])
		for _, lb := range labels[r] {
			l := counts[key{r, lb}]
			l.Precision = share(l.Decisions[sdk.VerdictRight], l.Decisions[sdk.VerdictWouldHaveKilledLiveWork])
			ok, wrong = ok+l.Decisions[sdk.VerdictRight], wrong+l.Decisions[sdk.VerdictWouldHaveKilledLiveWork]
			rj.Labels = append(rj.Labels, *l)
		}
		rj.Precision = share(ok, wrong)
		var missed []shadowAttemptJSON
		for a, marks := range lostBy {
			if flagged[r][a] || liveWork[a] {
				continue
			}
			for _, m := range marks {
				if m.Reaper == r {
					continue
				}
				j := attemptOfGroup(m)
				j.Reaper, j.Label = m.Reaper, m.Label
				missed = append(missed, j)
				break
			}
		}
		sort.Slice(missed, func(i, j int) bool { return missed[i].FirstID < missed[j].FirstID })
		rj.RightAttempts, rj.MissedAttempts = len(right[r]), len(missed)
		rj.Recall = share(rj.RightAttempts, rj.MissedAttempts)
		if verbose {
			rj.Missed = missed
		}
		doc.Reapers = append(doc.Reapers, rj)
	}
	return doc
}

// share is good / (good + bad), nil when both are zero.
func share(good, bad int) *float64 {
	if good+bad == 0 {
		return nil
	}
	r := float64(good) / float64(good+bad)
	return &r
}

func shadowTable(w io.Writer, doc shadowJSON, verbose bool) error {
	fmt.Fprintf(w, "shadow decisions since %s (%s)\n", stamp(doc.Since), human(time.Duration(doc.WindowSeconds*float64(time.Second))))
	if doc.Truncated {
		fmt.Fprintf(w, "(only the first %d groups of decisions were read: narrow -window or -reaper)\n", board.ShadowGroupsMax)
	}
	if len(doc.Reapers) == 0 {
		fmt.Fprintln(w, "no shadow decisions in the window (dry run, policy = \"hold\", or provisional kube marks)")
		return nil
	}
	fmt.Fprintln(w, "each count: decisions (attempts); precision = right / (right + would have killed live work)")
	t := newTable(w, "REAPER", "LABEL", "KILLED-LIVE-WORK", "RIGHT", "UNRESOLVED", "UNSCORED", "PRECISION", "RECALL")
	for _, r := range doc.Reapers {
		for _, l := range r.Labels {
			cells := []string{r.Reaper, l.Label}
			for _, col := range shadowColumns {
				cells = append(cells, fmt.Sprintf("%d (%d)", l.Decisions[col], l.Attempts[col]))
			}
			t.row(append(cells, ratioPercent(l.Precision), "-")...)
		}
		t.row(r.Reaper, "(all)", "", "", "", "", ratioPercent(r.Precision),
			fmt.Sprintf("%s (%d of %d)", ratioPercent(r.Recall), r.RightAttempts, r.RightAttempts+r.MissedAttempts))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "recall = attempts right / (right + settled lost by another reaper's standing mark, not flagged)")
	if !verbose {
		fmt.Fprintln(w, "(-v names the attempts and decisions behind each number)")
		return nil
	}
	for _, r := range doc.Reapers {
		for _, l := range r.Labels {
			for _, col := range shadowColumns {
				if len(l.Behind[col]) == 0 {
					continue
				}
				fmt.Fprintf(w, "\n%s %s, %s:\n", r.Reaper, l.Label, col)
				for _, a := range l.Behind[col] {
					fmt.Fprintf(w, "  %s\n", behindLine(a))
				}
			}
		}
		if len(r.Missed) > 0 {
			fmt.Fprintf(w, "\n%s missed (settled lost by another reaper's mark, never flagged):\n", r.Reaper)
			for _, a := range r.Missed {
				fmt.Fprintf(w, "  %s (%s by %s)\n", behindLine(a), a.Label, a.Reaper)
			}
		}
	}
	return nil
}

// behindLine names an attempt and the decisions about it.
func behindLine(a shadowAttemptJSON) string {
	name := attemptName(sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: a.Try, Epoch: a.Epoch})
	if a.Decisions == 1 {
		return fmt.Sprintf("%s: decision %d at %s", name, a.FirstID, stamp(a.FirstAt))
	}
	return fmt.Sprintf("%s: %d decisions, %d at %s to %d at %s", name, a.Decisions, a.FirstID, stamp(a.FirstAt),
		a.LastID, stamp(a.LastAt))
}

// ratioPercent renders a ratio that may be undefined (nil: "-").
func ratioPercent(r *float64) string {
	if r == nil {
		return "-"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", *r*100), ".0") + "%"
}
