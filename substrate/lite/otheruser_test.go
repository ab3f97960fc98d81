package lite_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite"
	"github.com/dexaflow/reaper/substrate/lite/proc"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/unpriv"
)

// probeHelperEnv, when set, makes this test binary the unprivileged prober
// of TestTaskGroupMemberOfAnotherUserCountsAlive instead of running tests.
// Its value is the record directory; the group to record is in the
// variables below.
const probeHelperEnv = "LITE_TEST_PROBE_AS_OTHER_USER"

const (
	probePGIDEnv  = "LITE_TEST_PROBE_PGID"
	probeStartEnv = "LITE_TEST_PROBE_LEADER_START"
)

// probeAnswer is what the prober prints: what signal 0 to the group told it
// and the liveness Probe read.
type probeAnswer struct {
	Kill0    string
	State    sdk.Liveness
	Agent    sdk.Liveness
	Group    sdk.Liveness
	Orphan   bool
	Detail   string
	Problems string
}

var probeAttempt = sdk.Attempt{RunID: "run", TaskID: "task", Try: 1}

// probeHelper records the group it is given in a record directory of its
// own and probes it, as the Lite substrate does.
func probeHelper() int {
	answer := func(a probeAnswer) int {
		b, _ := json.Marshal(a)
		fmt.Println(string(b))
		return 0
	}
	pgid, err1 := strconv.Atoi(os.Getenv(probePGIDEnv))
	start, err2 := strconv.ParseUint(os.Getenv(probeStartEnv), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return answer(probeAnswer{Problems: err.Error()})
	}
	dir, err := records.Open(os.Getenv(probeHelperEnv))
	if err != nil {
		return answer(probeAnswer{Problems: err.Error()})
	}
	defer dir.Close()
	boot, _ := proc.BootID()
	// The agent that started the group was its leader: gone too.
	if err := dir.WriteGroup(records.GroupRecord{Attempt: probeAttempt, PGID: pgid, AgentPID: pgid,
		AgentStart: start, LeaderStart: start, Boot: boot}); err != nil {
		return answer(probeAnswer{Problems: err.Error()})
	}
	kill0 := "ok"
	if err := unix.Kill(-pgid, 0); err != nil {
		kill0 = unix.ErrnoName(err.(unix.Errno))
	}
	got, err := lite.Probe(context.Background(), dir, []sdk.Attempt{probeAttempt}, nil)
	if err != nil {
		return answer(probeAnswer{Kill0: kill0, Problems: err.Error()})
	}
	l := got[0]
	return answer(probeAnswer{Kill0: kill0, State: l.State, Agent: l.Agent, Group: l.Group, Orphan: l.Orphan, Detail: l.Detail})
}

// A recorded task group whose only process left belongs to another user
// (a task that changed user, say) cannot be signalled by the substrate:
// signal 0 answers EPERM, which proves the group exists. The attempt reads
// alive, so no reaper fails it and its group is never stopped.
//
// As root, the test leaves a process of its own in a group whose leader
// exited, and re-runs this binary as an unprivileged user to record and
// probe that group.
func TestTaskGroupMemberOfAnotherUserCountsAlive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the prober and the task group's member as two different users")
	}
	cred := unpriv.Find(t).Credential()

	// The group: a shell that leaves a sleep behind and exits once told.
	sh := exec.Command("sh", "-c", "sleep 300 & echo $!; read _")
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := sh.Process.Pid
	t.Cleanup(func() { _, _ = proc.SignalGroup(pgid, unix.SIGKILL) })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the member's pid: %v", err)
	}
	member, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	leader, err := proc.Stat(pgid)
	if err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	_ = sh.Wait() // the leader exits and is reaped: only the member is left
	if info, err := proc.Stat(member); err != nil || info.PGID != pgid || info.Zombie {
		t.Fatalf("member %d: %+v, %v; want it running in group %d", member, info, err, pgid)
	}

	// The prober: this binary, copied where the other user can run it, with
	// a record directory of that user's own.
	base, err := os.MkdirTemp("", "lite-other-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "lite.test")
	unpriv.CopySelf(t, bin)
	recDir := filepath.Join(base, "records")
	if err := os.Mkdir(recDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(recDir, int(cred.Uid), int(cred.Gid)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{probeHelperEnv + "=" + recDir, probePGIDEnv + "=" + strconv.Itoa(pgid),
		probeStartEnv + "=" + strconv.FormatUint(leader.Start, 10), "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the prober: %v\n%s", err, out)
	}
	var got probeAnswer
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the prober said %q: %v", out, err)
	}
	if got.Problems != "" {
		t.Fatalf("the prober: %s", got.Problems)
	}
	t.Logf("signal 0: %s; liveness: %s", got.Kill0, got.Detail)
	if got.Kill0 != "EPERM" {
		t.Fatalf("signal 0 to the group answered %s, want EPERM (the group belongs to another user)", got.Kill0)
	}
	if got.State != sdk.Alive || got.Group != sdk.Alive || got.Agent != sdk.Dead || got.Orphan {
		t.Fatalf("liveness = state %s agent %s group %s orphan %v (%s); want alive, its group alive and unverifiable",
			got.State, got.Agent, got.Group, got.Orphan, got.Detail)
	}
	if info, err := proc.Stat(member); err != nil || info.Zombie {
		t.Fatalf("the member was touched: %+v, %v", info, err)
	}
}
