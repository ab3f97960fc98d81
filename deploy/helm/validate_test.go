package helm_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/testkit/kubetest"
	"github.com/dexaflow/reaper/testkit/validatetest"
)

// TestChartConfigurationIsAcceptedByReaperdValidate renders the chart's
// ConfigMap, with the default and with other values, with the postgres
// leader and with the kube runner, and runs reaperd
// validate on its HCL with the real plugin binaries: the file parses, the
// ladder is in order, and the kube substrate and the five reapers start and
// accept their blocks, and the DSN is read from the file store.dsn_file
// names. Three things change from what the pod would run: plugin_dir points
// at the binaries built for the test, the substrate is given the test
// cluster's kubeconfig (the pod uses its ServiceAccount), and dsn_file
// names a file of the test's, of this user's (the pod's is root's, 0440,
// its group the pod's fsGroup).
func TestChartConfigurationIsAcceptedByReaperdValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reaperd and the kube plugins")
	}
	c := kubetest.Current(t)
	pkgs := []string{"../../cmd/reaperd", "../../substrate/kube/cmd/reaper-substrate-kube"}
	for _, r := range strings.Fields(reaperOrder) {
		pkgs = append(pkgs, "../../plugins/"+r+"/cmd/reaper-"+r)
	}
	bin := validatetest.Build(t, pkgs...)

	for name, values := range map[string][]string{
		"defaults":        nil,
		"custom":          {"--values", customValues},
		"leader_postgres": {"--set", "config.leader.kind=postgres"},
		"runner": append([]string{"--set", "config.leader.kind=postgres", "--set", "config.runner.enabled=true",
			"--set", "config.runner.kube.image=task:1", "--set", "config.runner.settings.max_parallel=10"}, attemptAPISecrets...),
	} {
		t.Run(name, func(t *testing.T) {
			ns := c.NewNamespace(t)
			objs := render(t, "reaper-system", append([]string{"--set", "taskNamespace.name=" + ns,
				"--set", "taskNamespace.create=false", "--set", "config.kube.kubeconfig=" + c.Kubeconfig()}, values...)...)
			var hcl string
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" {
					hcl = configOf(t, objs, o.GetName())
				}
			}
			if !strings.Contains(hcl, "\nplugin_dir = \"/usr/local/bin\"\n") {
				t.Fatalf("the configuration does not take the plugins from the image's /usr/local/bin:\n%s", hcl)
			}
			out, err := validatetest.Validate(t, bin, withDSNFile(t, hcl, 0o600))
			if err != nil || !strings.Contains(out, ": valid (edition kube, substrate kube") {
				t.Fatalf("reaperd validate: %v\n%s\n%s", err, out, hcl)
			}
			if name != "defaults" {
				return
			}
			// The mode is what keeps the DSN: a file others may read is
			// refused, at its line.
			out, err = validatetest.Validate(t, bin, withDSNFile(t, hcl, 0o644))
			if err == nil || !strings.Contains(out, `Invalid value for "dsn_file"`) || !strings.Contains(out, "mode 0644") {
				t.Fatalf("reaperd validate of a DSN file others may read: %v\n%s", err, out)
			}
		})
	}
}

// withDSNFile writes a DSN to a file of the given mode and points the
// configuration's dsn_file, which must name the file the chart mounts from
// the database Secret, at it.
func withDSNFile(t *testing.T, hcl string, mode os.FileMode) []byte {
	t.Helper()
	const mounted = "\n  dsn_file = \"/etc/reaper-db/"
	i := strings.Index(hcl, mounted)
	if i < 0 {
		t.Fatalf("the configuration reads no DSN file from /etc/reaper-db:\n%s", hcl)
	}
	line := hcl[i+1:]
	line = line[:strings.IndexByte(line, '\n')]
	path := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(path, []byte("postgres://reaper@127.0.0.1:1/reaper?sslmode=disable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return []byte(strings.Replace(hcl, line, "  dsn_file = "+strconv.Quote(path), 1))
}
