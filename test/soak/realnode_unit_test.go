package soak

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/kuberunner"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

// TestJournalLinkerBringsEachJournalOutOnceNamedByItsPod: a journal in a
// pod's scratch volume is brought into the soak's journal directory under
// its pod's uid, keeps growing there after it is linked, and outlives the
// pod's volume.
func TestJournalLinkerBringsEachJournalOutOnceNamedByItsPod(t *testing.T) {
	pods, dst := t.TempDir(), t.TempDir()
	vol := filepath.Join(pods, "uid-1", "volumes", "kubernetes.io~empty-dir", kuberunner.TmpVolume, filepath.Base(realJournalDir))
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(vol, "a.7.journal")
	if err := os.WriteFile(src, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := &journalLinker{podsDir: pods, dst: dst, seen: map[string]*linked{}}
	j.scan()
	f, err := os.OpenFile(src, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	j.scan()
	if err := os.RemoveAll(filepath.Join(pods, "uid-1")); err != nil {
		t.Fatal(err)
	}
	j.scan()
	got, err := os.ReadFile(filepath.Join(dst, "uid-1.a.7.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "one\ntwo\n" {
		t.Fatalf("the journal brought out holds %q, want both lines", got)
	}
	if links, copies := j.counts(); links+copies != 1 {
		t.Fatalf("%d linked and %d copied, want one journal", links, copies)
	}
}

// TestKubeletPodsDirIsUnderItsRootDir reads the pods directory off a
// command line naming --root-dir either way.
func TestKubeletPodsDirIsUnderItsRootDir(t *testing.T) {
	for _, args := range [][]string{{"--root-dir", "/r"}, {"--root-dir=/r"}} {
		if got := podsDirOf(append([]string{"kubelet", "--config", "c"}, args...)); got != "/r/pods" {
			t.Errorf("%q: pods directory %q, want /r/pods", args, got)
		}
	}
	if got := podsDirOf([]string{"kubelet"}); got != "" {
		t.Errorf("no --root-dir: %q, want none", got)
	}
}

// TestPIDResolverFindsAProcessByItsStartAndStandsInForAGoneOne: the host's
// processes are indexed by their start, one outside the pod's cgroup is
// never taken for the pod's, and a process not found gets a stand-in below
// zero, the same on every later line of its journal.
func TestPIDResolverFindsAProcessByItsStartAndStandsInForAGoneOne(t *testing.T) {
	self := os.Getpid()
	info, err := proc.Stat(self)
	if err != nil {
		t.Fatal(err)
	}
	if innermostPID(self) != self {
		t.Skip("the test runs in a pid namespace of its own")
	}
	h := readHostProcs()
	if found := h.byStart[info.Start]; !contains(found, self) {
		t.Fatalf("processes started at this one's start: %v, want %d among them", found, self)
	}
	if _, ok := h.find("no-such-pod", self, info.Start); ok {
		t.Error("found a process outside the pod's cgroup")
	}
	r := &pidResolver{agents: map[string]int{}}
	es := []agent.JournalEntry{
		{Event: agent.JournalAgentStart, PID: 7, AgentStart: 1},
		{Event: agent.JournalTaskStart, PID: 7, PGID: 9, LeaderStart: 1},
		{Event: agent.JournalAgentExit, PID: 7},
	}
	r.resolve("/j/uid-x.a.7.journal", es)
	if es[0].PID >= 0 || es[0].PID != es[2].PID || es[1].PID != es[0].PID || es[1].PGID >= 0 || es[1].PGID == es[0].PID {
		t.Fatalf("stand-ins %+v: want one below zero for the agent on every line, another for its group", es)
	}
	if n := r.counts(); n.agentsMissed != 1 || n.groupsMissed != 1 {
		t.Fatalf("counts %+v, want one agent and one group not found", n)
	}
}

func contains(pids []int, pid int) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}
