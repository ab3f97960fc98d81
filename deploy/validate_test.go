package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/testkit/validatetest"
)

// TestExampleConfigurationsValidate runs `reaperd validate` on the shipped
// configurations, with real plugin binaries: the file parses, its ladder is in
// order, and every plugin it names starts and accepts its block. Only
// plugin_dir is pointed at the binaries built for the test.
func TestExampleConfigurationsValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reaperd and the Lite plugins")
	}
	bin := validatetest.Build(t,
		"../cmd/reaperd", "../substrate/lite/cmd/reaper-substrate-lite",
		"../plugins/dispatchlost/cmd/reaper-dispatchlost", "../plugins/agentlost/cmd/reaper-agentlost",
		"../plugins/orphanrun/cmd/reaper-orphanrun")
	for _, file := range []string{liteHCLPath, "../config.hcl.example"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			out, err := validatetest.Validate(t, bin, readFile(t, file))
			if err != nil || !strings.Contains(out, ": valid (edition lite") {
				t.Fatalf("reaperd validate %s: %v\n%s", file, err, out)
			}
		})
	}
}
