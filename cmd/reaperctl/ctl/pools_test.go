package ctl

import (
	"strings"

	"github.com/dexaflow/reaper/sdk"
	"testing"
	"time"
)

// TestStatusShowsThePools: with pool blocks configured, status lists each
// pool's slots and their use, a silent holder apart, and a pool tasks
// name that no block does as not configured; submit refuses a task of
// such a pool up front.
func TestStatusShowsThePools(t *testing.T) {
	t.Parallel()
	b := setup(t, "runner {\n  pool \"db\" {\n    slots = 4\n  }\n}\n")
	rf := writeRunFile(t, `
task "load" {
  command = "true"
  pool = "db"
  pool_slots = 2
}
task "quiet" {
  command = "true"
  pool = "db"
}
task "next" {
  command = "true"
  pool = "db"
}
task "plain" {
  command = "true"
}
`)
	b.ctl(t, "submit", "-run", "r", "-file", rf).ok(t)
	b.running(t, first("r", "load"), base.Add(-4*time.Minute), base.Add(-3*time.Minute), base.Add(-10*time.Second))
	b.running(t, first("r", "quiet"), base.Add(-4*time.Minute), base.Add(-3*time.Minute), base.Add(-3*time.Minute))
	b.scheduled(t, first("r", "next"))
	if _, err := b.pool.Exec(t.Context(), `UPDATE task_instances SET pool = 'gpu' WHERE task_id = 'plain'`); err != nil {
		t.Fatal(err)
	}
	b.scheduled(t, first("r", "plain"))

	r := b.ctl(t, "status").ok(t)
	for _, want := range []string{
		"POOL          SLOTS           QUEUED  RUNNING  SILENT  OPEN  WAITING  RECOVERING",
		"db            4               0       3        1       1     1        0",
		"default_pool  unbounded       0       0        0       -     0        0",
		"gpu           not configured  0       0        0       -     1        0",
	} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("status does not show %q:\n%s", want, r.stdout)
		}
	}
	var doc statusJSON
	b.ctl(t, "status", "-json").decode(t, &doc)
	if len(doc.Pools) != 3 || doc.Pools[0].Pool != "db" || *doc.Pools[0].Open != 1 || doc.Pools[2].Configured {
		t.Fatalf("pools %+v", doc.Pools)
	}

	b.ctl(t, "submit", "-file", writeRunFile(t, "task \"x\" {\n  command = \"true\"\n  pool = \"gpu\"\n}\n")).
		failed(t, 2, `task x: pool "gpu" is not configured (the runner's pool blocks name: default_pool, db)`)
}

// scheduled drives a fresh attempt to scheduled.
func (b *bundle) scheduled(t *testing.T, a sdk.Attempt) {
	t.Helper()
	if ok, err := b.w.Enqueue(t.Context(), a, base.Add(-time.Minute)); err != nil || !ok {
		t.Fatalf("enqueue %s: %v %v", a, ok, err)
	}
}
