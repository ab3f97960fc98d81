package kubee2e_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/internal/kubetest"
)

// TestKubeFaultSuite runs every scenario side by side on the shared
// cluster (the API server outage on a cluster of its own) and prints the
// figures table.
func TestKubeFaultSuite(t *testing.T) {
	start := time.Now()
	c := kubetest.Current(t)
	t.Run("scenarios", func(t *testing.T) {
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				sc.run(t, c)
			})
		}
	})
	t.Log(book.table(time.Since(start)))
}

// scenarios are the suite's, numbered in the table by their place here.
var scenarios = []struct {
	name string
	run  func(*testing.T, *kubetest.Cluster)
}{
	{"PodDeletedUnderARunningAttemptIsReapedAndRePlaced", podDeleted},
}

// A running attempt's pod is deleted: the agent dies with it, the pod is
// gone, and the attempt is reaped on the infra rail and re-placed on a new
// epoch that succeeds; the bystander is untouched.
func podDeleted(t *testing.T, c *kubetest.Cluster) {
	s := newScenario(t, 1, "pod deleted under a running attempt", c)
	s.startDaemon()
	s.startDaemon()
	s.leader(30 * time.Second)
	s.submit(victim("victim"), bystander("bystander"))
	a, p := s.waitRunning("victim")
	s.waitRunning("bystander")
	f := s.harm("pod deleted", a, max(agentLost, podLostFloor))
	s.deletePod(p)
	s.waitReaped(f, time.Minute)
	s.finish()
}
