package install_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/helmrelease"
)

// Day two: helm upgrade to a second image while attempts run, helm
// rollback to the first, and a binary below the board's migration floor.

// secondVersion is the upgrade's image: the same code, a higher version,
// built with the board's no-op probe migration (an additive one).
const (
	secondVersion = "0.0.2-install"
	probeTag      = "reaper_upgrade_probe"
)

// watch samples, while a change rolls the replicas, what each replica says
// of its own leadership (its reaper_leader gauge) and how many are Ready.
type watch struct {
	mu sync.Mutex
	// overlaps counts the rounds in which two replicas said they led, and
	// doubles the times two rounds in a row did so (the violation: one
	// round can catch a handover between two reads).
	overlaps, doubles int
	// longestNone is the longest stretch in which no replica led.
	longestNone time.Duration
	// minReady is the fewest Ready replicas seen.
	minReady int
	stop     func()
}

func (r *release) watchReplicas(ctx context.Context) *watch {
	w := &watch{minReady: 2}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	w.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		var noneSince time.Time
		prevOverlap := false
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			pods, err := r.Replicas(ctx)
			if err != nil {
				continue
			}
			leaders, readyN := 0, 0
			for _, p := range pods {
				if helmrelease.Ready(p) && p.DeletionTimestamp == nil {
					readyN++
				}
				if p.Status.PodIP != "" && scrape(ctx, p.Status.PodIP, "reaper_leader") == "1" {
					leaders++
				}
			}
			now := time.Now()
			w.mu.Lock()
			w.minReady = min(w.minReady, readyN)
			if leaders > 1 {
				w.overlaps++
				if prevOverlap {
					w.doubles++
				}
			}
			prevOverlap = leaders > 1
			if leaders == 0 {
				if noneSince.IsZero() {
					noneSince = now
				}
				w.longestNone = max(w.longestNone, now.Sub(noneSince))
			} else {
				noneSince = time.Time{}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// scrape reads one unlabelled metric from a replica's telemetry port ("" on
// any failure: a replica stopping or starting).
func scrape(ctx context.Context, ip, name string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, _ := helmrelease.Metric(ctx, ip, name)
	return v
}

// check stops the watch and fails on two leaders or no Ready replica.
func (w *watch) check(t *testing.T, what string) {
	t.Helper()
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%s: longest time with no replica leading %s; rounds with two saying they led: %d (two in a row: %d); fewest Ready replicas %d",
		what, w.longestNone.Round(100*time.Millisecond), w.overlaps, w.doubles, w.minReady)
	if w.doubles > 0 {
		t.Errorf("%s: two replicas said they led in %d consecutive rounds", what, w.doubles)
	}
	if w.minReady < 1 {
		t.Errorf("%s: no replica was Ready at some moment (the PodDisruptionBudget and the rollout allow one down)", what)
	}
}

// phaseUpgrade: helm upgrade to the second image (built with the probe
// migration, which the operator applies first with that image's reaperd,
// as docs/operate.md says) while two tasks run; the replicas roll one at
// a time, never two leaders, the tasks untouched and each run once.
func (r *release) phaseUpgrade(ctx context.Context, t *testing.T, lg *ledger) {
	const runID = "upgrade"
	tasks := []string{"a", "b"}
	r.submitLedger(ctx, lg, runID, tasks...)
	r.check(r.ImportImage(ctx, helmrelease.ImageOptions{Version: secondVersion, Tags: probeTag}))
	probe := filepath.Join(binDir, "reaperd-probe")
	build := exec.CommandContext(ctx, "go", "build", "-tags", probeTag, "-o", probe, "github.com/dexaflow/reaper/cmd/reaperd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe reaperd: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, probe, "migrate", "-config", r.HostConfig).CombinedOutput()
	if err != nil {
		t.Fatalf("reaperd migrate (the second image's): %v\n%s", err, out)
	}
	t.Logf("reaperd migrate: %s", strings.TrimSpace(string(out)))

	w := r.watchReplicas(ctx)
	begin := time.Now()
	if out, err := r.Upgrade(ctx, secondVersion, "--wait", "--timeout", "5m"); err != nil {
		w.stop()
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	r.check(r.WaitImages(ctx, helmrelease.ImageRepository+":"+secondVersion))
	r.check(r.WaitReplicasReady(ctx))
	t.Logf("helm upgrade: both replicas on %s and Ready %s after it began", secondVersion, time.Since(begin).Round(100*time.Millisecond))
	time.Sleep(settle) // the new leader's grace and cycles, in real time
	w.check(t, "upgrade")
	r.expectUntouched(ctx, runID)
	lg.release(runID)
	r.expectSuccess(ctx, runID, 2*time.Minute)
	r.expectOneExecution(lg, runID, tasks...)
	var n int
	if err := r.Board.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE name LIKE '%upgrade_probe%'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the probe migration is recorded %d times (%v), want once", n, err)
	}
}

// phaseRollback: helm rollback to the first release; its binary knows no
// probe migration, but the probe is additive, so the floor lets it serve.
func (r *release) phaseRollback(ctx context.Context, t *testing.T, lg *ledger) {
	const runID = "rollback"
	tasks := []string{"a"}
	r.submitLedger(ctx, lg, runID, tasks...)
	w := r.watchReplicas(ctx)
	begin := time.Now()
	if out, err := r.Helm(ctx, "rollback", helmrelease.Name, "1", "--namespace", helmrelease.Namespace, "--wait", "--timeout", "5m"); err != nil {
		w.stop()
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	r.check(r.WaitImages(ctx, helmrelease.ImageRepository+":"+firstVersion))
	r.check(r.WaitReplicasReady(ctx))
	t.Logf("helm rollback: both replicas back on %s and Ready %s after it began", firstVersion, time.Since(begin).Round(100*time.Millisecond))
	time.Sleep(settle)
	w.check(t, "rollback")
	r.expectUntouched(ctx, runID)
	lg.release(runID)
	r.expectSuccess(ctx, runID, 2*time.Minute)
	r.expectOneExecution(lg, runID, tasks...)
}

// phaseBelowFloor: a migration that raised the floor above the running
// image (written as a newer release's breaking migration would be): a
// replica started on that image refuses, saying why in one line in its
// log and its readiness, and is not Ready; once the row is gone it serves.
func (r *release) phaseBelowFloor(ctx context.Context, t *testing.T, _ *ledger) {
	var top int
	if err := r.Board.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&top); err != nil {
		t.Fatal(err)
	}
	breaking := top + 1
	name := fmt.Sprintf("%03d_breaking.sql", breaking)
	if _, err := r.Board.Exec(ctx, `INSERT INTO schema_migrations (version, name, floor) VALUES ($1, $2, $1)`, breaking, name); err != nil {
		t.Fatal(err)
	}
	removed := false
	defer func() {
		if !removed {
			_, _ = r.Board.Exec(context.Background(), `DELETE FROM schema_migrations WHERE version = $1`, breaking)
		}
	}()
	fresh := r.replaceReplica(ctx)
	health := r.expectRefusing(ctx, fresh, "below the database's floor "+fmt.Sprint(breaking))
	t.Logf("below the floor, the replica's readiness: %s", strings.TrimSpace(health))
	if _, err := r.Board.Exec(ctx, `DELETE FROM schema_migrations WHERE version = $1`, breaking); err != nil {
		t.Fatal(err)
	}
	removed = true
	r.check(r.WaitReplicasReady(ctx))
}
