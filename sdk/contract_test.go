package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The contract a plugin author imports must stay small: the standard
// library, and the contract's own clock and ladder. The transport (gRPC,
// go-plugin, protobuf) lives in sdk/plugin, beside it, and a package that
// only needs the vocabulary (the board, the Lite records) must not link it.
func TestContractImportsOnlyTheStandardLibrary(t *testing.T) {
	allowed := map[string]bool{
		"github.com/dexaflow/reaper/sdk":        true,
		"github.com/dexaflow/reaper/sdk/clock":  true,
		"github.com/dexaflow/reaper/sdk/ladder": true,
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/dexaflow/reaper/sdk").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if !allowed[dep] {
			t.Errorf("the sdk contract depends on %s", dep)
		}
	}
	for _, pkg := range []string{"github.com/dexaflow/reaper/board", "github.com/dexaflow/reaper/substrate/lite/records",
		"github.com/dexaflow/reaper/sdk/reap"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "google.golang.org/grpc") || strings.HasPrefix(dep, "github.com/hashicorp/go-plugin") ||
				strings.HasPrefix(dep, "google.golang.org/protobuf") {
				t.Errorf("%s links the plugin transport (%s)", pkg, dep)
			}
		}
	}
}
