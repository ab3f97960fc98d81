package deploy_test

import (
	"slices"
	"strings"
	"testing"
)

// Reapers run in the order a configuration lists them, and the one the
// project ships for each edition lists dispatch-lost before orphan-run: a
// queued attempt whose dispatch was lost is marked before its run is judged
// for having nothing live left.
func TestShippedConfigurationsRunDispatchLostBeforeOrphanRun(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"SystemdLite", liteHCLPath, []string{"dispatchlost", "agentlost", "orphanrun"}},
		{"ExampleLite", "../config.hcl.example", []string{"dispatchlost", "agentlost", "orphanrun"}},
		// The kube edition's blocks, commented out in the example.
		{"ExampleKube", "../config.hcl.example#kube", []string{"dispatchlost", "podlost", "agentlost", "warmworker", "orphanrun"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, commented := strings.CutSuffix(tc.file, "#kube")
			var got []string
			for _, line := range strings.Split(string(readFile(t, file)), "\n") {
				line = strings.TrimSpace(line)
				if commented {
					var ok bool
					if line, ok = strings.CutPrefix(line, "# "); !ok {
						continue
					}
				}
				if rest, ok := strings.CutPrefix(line, `reaper "`); ok {
					got = append(got, rest[:strings.IndexByte(rest, '"')])
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("reapers %v, want %v", got, tc.want)
			}
			if slices.Index(got, "dispatchlost") > slices.Index(got, "orphanrun") {
				t.Fatalf("orphanrun runs before dispatchlost: %v", got)
			}
		})
	}
}
