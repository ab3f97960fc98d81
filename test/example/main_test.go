// Package example_test runs the example plugin of examples/parked the way
// its author would ship it: built from its own module as a separate binary,
// put in reaperd's plugin_dir next to the real Lite substrate, configured in
// HCL, and run by the real reaperd against a real PostgreSQL.
package example_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// binDir is reaperd's plugin_dir in every test: reaperd, the Lite substrate
// and agent, and reaper-parked, built once by TestMain.
var binDir string

// packages of this module built into binDir, each under its package's name.
var packages = []string{
	"github.com/dexaflow/reaper/cmd/reaperd",
	"github.com/dexaflow/reaper/cmd/reaper-agent",
	"github.com/dexaflow/reaper/substrate/lite/cmd/reaper-substrate-lite",
}

// exampleModule is the example plugin's module, relative to this package.
const exampleModule = "../../examples/parked"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	return testbin.Main(m, "example", packages, func(m *testing.M, bin string) int {
		// The plugin is built from its own module, with its own go.mod, as
		// an author outside this repository builds it: no workspace joins
		// the two.
		plugin := exec.Command("go", "build", "-C", exampleModule, "-o", bin+"/reaper-parked", "./cmd/reaper-parked")
		plugin.Env = append(os.Environ(), "GOWORK=off")
		plugin.Stdout, plugin.Stderr = os.Stderr, os.Stderr
		if err := plugin.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "example test: build reaper-parked from its module:", err)
			return 2
		}
		binDir = bin
		return pgtest.Run(m)
	})
}
