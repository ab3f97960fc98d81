package ctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
)

// poolJSON is one pool in status -o json.
type poolJSON struct {
	Pool string `json:"pool"`
	// Slots is the configured slots; null for an unbounded pool.
	Slots   *int `json:"slots"`
	Queued  int  `json:"queued"`
	Running int  `json:"running"`
	Silent  int  `json:"silent"`
	// Open is the slots left; null for an unbounded pool.
	Open    *int `json:"open"`
	Waiting int  `json:"waiting"`
	// RecoveryWaiting is the part of Waiting that are re-placed or
	// retried attempts (waiting for a slot or the recovery budget).
	RecoveryWaiting int `json:"recovery_waiting"`
	// Configured is false for a pool tasks name that no pool block does:
	// its tasks never start.
	Configured bool `json:"configured"`
}

// poolRows reads every pool's use and the configuration's pools: each
// configured pool, the default pool, and any other pool a task names.
func poolRows(ctx context.Context, s *session, now time.Time) ([]poolJSON, error) {
	silent := now.Add(-lifecycle.SilentHeartbeats * s.cfg.Ladder.Heartbeat)
	use, err := s.writer.PoolUsage(ctx, silent)
	if err != nil {
		return nil, err
	}
	var configured map[string]int
	if s.cfg.Runner != nil {
		configured = s.cfg.Runner.Pools
	}
	rows := map[string]*poolJSON{}
	row := func(name string) *poolJSON {
		if p, ok := rows[name]; ok {
			return p
		}
		p := &poolJSON{Pool: name, Configured: name == lifecycle.DefaultPool || len(configured) == 0}
		if n, ok := configured[name]; ok {
			p.Configured, p.Slots = true, &n
		}
		rows[name] = p
		return p
	}
	row(lifecycle.DefaultPool)
	for name := range configured {
		row(name)
	}
	for _, u := range use {
		p := row(u.Pool)
		p.Queued, p.Running, p.Silent, p.Waiting, p.RecoveryWaiting = u.Queued, u.Running, u.Silent, u.Waiting, u.RecoveryWaiting
	}
	var out []poolJSON
	for _, p := range rows {
		if p.Slots != nil {
			open := max(*p.Slots-p.Queued-p.Running, 0)
			p.Open = &open
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b poolJSON) int {
		switch {
		case a.Pool < b.Pool:
			return -1
		case a.Pool > b.Pool:
			return 1
		}
		return 0
	})
	return out, nil
}

// poolTable writes the pools: slots and their use. SILENT is the part of
// RUNNING held by attempts without a word for three heartbeat periods,
// which a reaper gives back when it settles a lost one; RECOVERING the part
// of WAITING that are re-placed or retried attempts, waiting for a slot or
// the recovery budget.
func poolTable(w io.Writer, pools []poolJSON) error {
	t := newTable(w, "POOL", "SLOTS", "QUEUED", "RUNNING", "SILENT", "OPEN", "WAITING", "RECOVERING")
	for _, p := range pools {
		slots, open := "unbounded", "-"
		if p.Slots != nil {
			slots, open = strconv.Itoa(*p.Slots), strconv.Itoa(*p.Open)
		}
		if !p.Configured {
			slots = "not configured"
		}
		t.row(p.Pool, slots, strconv.Itoa(p.Queued), strconv.Itoa(p.Running), strconv.Itoa(p.Silent), open,
			strconv.Itoa(p.Waiting), strconv.Itoa(p.RecoveryWaiting))
	}
	if err := t.flush(); err != nil {
		return fmt.Errorf("write the pools: %w", err)
	}
	return nil
}

// busy: the pools are worth a table: one is configured with slots, or
// tasks name one that is not. With no pool block, every pool is unbounded
// and the runs' counts say it all.
func busy(pools []poolJSON) bool {
	for _, p := range pools {
		if p.Slots != nil || !p.Configured {
			return true
		}
	}
	return false
}
