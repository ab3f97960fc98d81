package kubereapers_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/dexaflow/reaper/internal/kubetest"
	"github.com/dexaflow/reaper/internal/pgtest"
)

// cluster is the test binary's Kubernetes control plane, set by TestMain
// for the duration of the tests.
var cluster atomic.Pointer[kubetest.Cluster]

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	c, err := kubetest.Start(context.Background(), kubetest.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubereapers: the test cluster did not start, so these tests cannot run:\n%v\n", err)
		return 1
	}
	defer func() {
		cluster.Store(nil)
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	cluster.Store(c)
	return pgtest.Run(m)
}
