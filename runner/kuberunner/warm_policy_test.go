package kuberunner

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/substrate/kube"
)

// TestWorkerPodCarriesTheWatchdogAndNoDeadline: a worker pod has no
// activeDeadlineSeconds, whatever the ceiling; its agent's watchdog is the
// credential ceiling, and a non-positive ceiling disables it.
func TestWorkerPodCarriesTheWatchdogAndNoDeadline(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		ceiling time.Duration
		want    string // the -watchdog flag, "" for none
	}{
		"CeilingIsTheWatchdog":         {ceiling: time.Hour, want: "-watchdog=1h0m0s"},
		"NonPositiveCeilingDisablesIt": {ceiling: -1, want: ""},
		"ZeroCeilingDisablesIt":        {ceiling: 0, want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			l := ladder.Defaults()
			l.CredentialCeiling = tc.ceiling
			cfg := Config{Ladder: l, WarmPool: &WarmPool{Name: "etl", Size: 1, Slots: 2, Poll: time.Second}}
			spec := warmSpec(cfg, PodSpec{Namespace: "ns", Image: "img", AgentPath: "reaper-agent",
				TerminationGrace: 30 * time.Second, Heartbeat: 15 * time.Second})
			pod := BuildWorkerPod(spec, "reaper-warm-etl-0123456789", nil)
			if pod.Spec.ActiveDeadlineSeconds != nil {
				t.Fatalf("activeDeadlineSeconds %d on a warm worker", *pod.Spec.ActiveDeadlineSeconds)
			}
			if pod.Labels[kube.LabelWarmPool] != "etl" || pod.Spec.Containers[0].Name != WorkerContainer {
				t.Fatalf("labels %v, container %s", pod.Labels, pod.Spec.Containers[0].Name)
			}
			// A worker serves many attempts and leaves no record of its own:
			// it carries no outcome record finalizer.
			if len(pod.Finalizers) != 0 {
				t.Fatalf("finalizers %q on a warm worker", pod.Finalizers)
			}
			args := strings.Join(pod.Spec.Containers[0].Args, " ")
			has := strings.Contains(args, "-watchdog=")
			if (tc.want == "" && has) || (tc.want != "" && !strings.Contains(args, tc.want)) {
				t.Fatalf("args %q, want watchdog %q", args, tc.want)
			}
			if !strings.Contains(args, "-slots=2") || !strings.Contains(args, "-worker=reaper-warm-etl-0123456789") {
				t.Fatalf("args %q", args)
			}
		})
	}
}

func TestWorkerNameIsADNSLabelOfItsPool(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 50 {
		name, err := WorkerName("a-very-long-pool-name-that-goes-on-and-on-and-on")
		if err != nil {
			t.Fatal(err)
		}
		if errs := validation.IsDNS1123Label(name); len(errs) != 0 || !strings.HasPrefix(name, "reaper-warm-a-very-long") {
			t.Fatalf("%q: %v", name, errs)
		}
		if seen[name] {
			t.Fatalf("%q twice", name)
		}
		seen[name] = true
	}
}
