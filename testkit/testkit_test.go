package testkit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// No product package imports the test kit: only tests (their _test.go
// files, which go list's Imports leaves out), the fault suites and other
// packages under test/, the demo and the kit itself may.
func TestNoProductPackageImportsTheTestKit(t *testing.T) {
	const module = "github.com/dexaflow/reaper"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	harness := func(pkg string) bool {
		for _, p := range []string{"/testkit", "/test/", "/demo"} {
			if strings.HasPrefix(strings.TrimPrefix(pkg, module), p) {
				return true
			}
		}
		return false
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || harness(f[0]) {
			continue
		}
		checked++
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module+"/testkit") {
				t.Errorf("product package %s imports the test kit's %s", f[0], imp)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d product packages: the listing is wrong", checked)
	}
}
