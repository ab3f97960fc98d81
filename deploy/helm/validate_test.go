package helm_test

import (
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
// accept their blocks. Two things change from what the pod would run:
// plugin_dir points at the binaries built for the test, and the substrate
// is given the test cluster's kubeconfig (the pod uses its ServiceAccount).
func TestChartConfigurationIsAcceptedByReaperdValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reaperd and the kube plugins")
	}
	c := kubetest.Current(t)
	pkgs := []string{"../../host/cmd/reaperd", "../../substrate/kube/cmd/reaper-substrate-kube"}
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
			out, err := validatetest.Validate(t, bin, []byte(hcl),
				"REAPER_DSN=postgres://reaper@127.0.0.1:1/reaper?sslmode=disable")
			if err != nil || !strings.Contains(out, ": valid (edition kube, substrate kube") {
				t.Fatalf("reaperd validate: %v\n%s\n%s", err, out, hcl)
			}
		})
	}
}
