package install_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// The tier's shared parts, made once by TestMain.
var (
	// binDir holds reaperctl, which submits runs from the machine, and
	// reaperd, which migrates the board before the install (and the
	// upgrade's reaperd, built by its phase).
	binDir string
	// db is the PostgreSQL the pods reach on the gateway (nil when the
	// machine cannot host the real node).
	db *pgtest.Server
	// hostWhy says why the machine cannot host the tier ("" when it can).
	hostWhy string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	return testbin.Main(m, "install", []string{
		"github.com/dexaflow/reaper/cmd/reaperctl", "github.com/dexaflow/reaper/cmd/reaperd"}, func(m *testing.M, bin string) int {
		binDir = bin
		if why := kubetest.HostCheck(); why != "" {
			if os.Getenv(kubetest.EnvRequireRealNode) == "1" {
				fmt.Fprintf(os.Stderr, "install: the real node is required (%s=1) but this machine cannot host one: %s\n",
					kubetest.EnvRequireRealNode, why)
				return 1
			}
			hostWhy = why
			return m.Run()
		}
		return kubetest.RunWithin(m, kubetest.Options{InCluster: true}, func(m *testing.M) int {
			// The database as a managed one is to the cluster: outside it,
			// on an address the pods route to, by password.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srv, err := pgtest.Start(ctx, pgtest.Options{Listen: []string{kubetest.NodeGateway}, AllowFrom: []string{kubetest.NodeSubnet}})
			if err != nil {
				fmt.Fprintf(os.Stderr, "install: start PostgreSQL on the gateway: %v\n", err)
				return 1
			}
			defer srv.Stop()
			db = srv
			return m.Run()
		})
	})
}
