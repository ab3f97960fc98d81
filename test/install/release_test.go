package install_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/helmrelease"
	"github.com/dexaflow/reaper/testkit/kubetest"
)

// release is the chart installed in the tier's cluster (helmrelease), held
// to the test running now.
type release struct {
	*helmrelease.Release
	t *testing.T
}

// newRelease prepares what a user prepares before helm install
// (helmrelease.Prepare): the task image on the node, a database with the
// board's schema, the release's namespace and its three Secrets. The
// release's namespaces are deleted at the test's end.
func newRelease(t *testing.T) *release {
	t.Helper()
	if hostWhy != "" {
		t.Skipf("install: no real node: %s", hostWhy)
	}
	c := kubetest.Current(t)
	c.NeedRealNode(t)
	root, err := helmrelease.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &release{t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rel, err := helmrelease.Prepare(ctx, helmrelease.Config{Cluster: c, DB: db, Root: root, Bin: binDir, Dir: t.TempDir(),
		Say: func(format string, args ...any) { r.t.Logf(format, args...) }})
	if err != nil {
		t.Fatal(err)
	}
	r.Release = rel
	t.Cleanup(func() {
		if err := rel.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// check fails the test running now on err.
func (r *release) check(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// dump logs what a failed test needs (helmrelease.Release.Dump).
func (r *release) dump(ctx context.Context) {
	var b strings.Builder
	r.Dump(ctx, &b)
	r.t.Log("\n" + b.String())
}
