package tasksecrets_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/literunner"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
	"github.com/dexaflow/reaper/substrate/lite/records"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// startControl starts a dumpable process of acct holding the canary in its
// environment: what the probe reads of it is what it would read of an
// agent that had not made itself non-dumpable.
func startControl(t *testing.T, acct account) string {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = []string{"CONTROL_SECRET=" + canary}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return strconv.Itoa(cmd.Process.Pid)
}

func refusedErrno(s string) bool { return s == "EACCES" || s == "EPERM" }

// checkShut fails t unless the probe, a task of acct, found nothing of its
// agent's: no credential in its environment, the agent's environ and
// memory refused, the canary nowhere, while the control process of the
// same user was readable.
func checkShut(t *testing.T, r probeResult, acct account) {
	t.Helper()
	t.Logf("the task (uid %d) under %s (pid %d): environ %s, mem %s; a dumpable process of the same user: %s",
		r.UID, r.ParentComm, r.PPID, r.Environ, r.Mem, r.Control)
	if r.UID != acct.UID {
		t.Errorf("the task ran as uid %d, want %d (%s)", r.UID, acct.UID, acct.Name)
	}
	if r.ParentComm != "reaper-agent" {
		t.Errorf("the task's parent is %q, want the agent", r.ParentComm)
	}
	if len(r.EnvSecrets) != 0 {
		t.Errorf("the task's environment holds %v", r.EnvSecrets)
	}
	if !refusedErrno(r.Environ) || !refusedErrno(r.Mem) {
		t.Errorf("the agent's /proc environ: %s, mem: %s; want EACCES (or EPERM)", r.Environ, r.Mem)
	}
	if r.Leak {
		t.Error("the canary secret reached the task")
	}
	if r.Control != "" && r.Control != "read" {
		t.Errorf("the control process of the same user read %q: the probe proves nothing", r.Control)
	}
}

// agentCmd is the real agent binary, run as acct.
func agentCmd(acct account, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(binDir, literunner.AgentBinary), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
	return cmd
}

// TestATaskCannotReadItsAgentsSecrets: in every mode of the agent (a Lite
// process, a pod's task container, a warm worker), its task, running as
// the agent's own non-root user, finds no credential in its environment
// and is refused the agent's /proc/<pid>/environ and /proc/<pid>/mem: the
// agent made itself non-dumpable before it read its credential. A process
// of that user that did not is readable (the control), so the refusal is
// the agent's doing.
func TestATaskCannotReadItsAgentsSecrets(t *testing.T) {
	secretEnv := []string{
		attempttoken.EnvToken + "=rat1." + canary, attempttoken.EnvAPI + "=https://127.0.0.1:9",
		"REAPER_DSN=postgres://reaper:" + canary + "@db/reaper",
	}
	for _, mode := range []string{agent.ModeLite, agent.ModePod} {
		name := map[string]string{
			agent.ModeLite: "LiteTaskAsTheAgentsNonRootUser_AgentsEnvironAndMemRefused",
			agent.ModePod:  "PodModeTaskAsTheAgentsNonRootUser_AgentsEnvironAndMemRefused",
		}[mode]
		t.Run(name, func(t *testing.T) {
			acct := unprivileged(t)
			w := newWorld(t, acct)
			env := append([]string{probeEnv + "=1", probeControlEnv + "=" + startControl(t, acct)}, secretEnv...)
			out := filepath.Join(w.work, "out")
			args := []string{"-mode", mode, "-record-dir", filepath.Join(w.work, "records"),
				"-run", "r", "-task", "t", "-try", "1", "-command", "exec " + w.probe,
				"-reporter", agent.ReporterFile, "-report-file", filepath.Join(w.work, "report.jsonl"), "-output", out}
			if mode == agent.ModePod {
				args = append(args, "-termination-message-path", filepath.Join(w.work, "termination-log"))
			}
			cmd := agentCmd(acct, env, args...)
			logs, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the agent: %v\n%s", err, logs)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			checkShut(t, parseProbe(t, string(data)), acct)
		})
	}

	t.Run("WarmTaskAsTheWorkersNonRootUser_NoWorkerTokenWorkerUnreadableAndItCannotClaim", func(t *testing.T) {
		acct := unprivileged(t)
		w := newWorld(t, acct)
		ctx := context.Background()
		lw := lifecycle.New(pgtest.NewDB(t), lifecycle.Options{})
		api := attemptapitest.Start(t, lw, attemptapitest.Options{})
		now := time.Now()
		a := sdk.Attempt{RunID: "run-warm", TaskID: "t", Try: 1}
		if err := lw.CreateRun(ctx, lifecycle.NewRun{RunID: a.RunID, DagID: "dag", Tasks: []lifecycle.NewTask{
			{TaskID: a.TaskID, Executor: sdk.ExecutorWarm, Command: "exec " + w.probe, ExecutionTimeout: time.Minute}}}, now); err != nil {
			t.Fatal(err)
		}
		for _, step := range []func() (bool, error){
			func() (bool, error) { return lw.Enqueue(ctx, a, now) },
			func() (bool, error) { return lw.QueueWarm(ctx, a, "warm-a", now) },
			func() (bool, error) { return lw.RecordMint(ctx, a, now) },
		} {
			if ok, err := step(); err != nil || !ok {
				t.Fatalf("binding the warm attempt: %v %v", ok, err)
			}
		}
		cred, err := api.Issuer.MintWorker("warm-a", now)
		if err != nil {
			t.Fatal(err)
		}
		env := append(append([]string(nil), cred.Env...), probeEnv+"=1", probeControlEnv+"="+startControl(t, acct),
			probeAPIEnv+"="+api.URL, probeCAEnv+"="+api.CA, probeWorkerEnv+"=warm-a")
		cmd := agentCmd(acct, env, "-mode", agent.ModeWorker, "-worker", "warm-a", "-reporter", agent.ReporterAPI,
			"-record-dir", filepath.Join(w.work, "records"), "-poll", "100ms", "-heartbeat", "1s")
		var stdout, stderr sdktest.LogBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stopped := false
		defer func() {
			if !stopped {
				_ = cmd.Process.Kill()
				<-exited
			}
		}()
		deadline := time.Now().Add(60 * time.Second)
		for {
			ti, err := lw.TaskInstance(ctx, a.RunID, a.TaskID)
			if err != nil {
				t.Fatal(err)
			}
			if ti.State == sdk.StateSuccess {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the warm attempt is %s after 60s\nworker:\n%s\n%s", ti.State, stdout.String(), stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			t.Fatalf("the drained worker: %v\n%s", err, stderr.String())
		}
		stopped = true
		r := parseProbe(t, stdout.String())
		checkShut(t, r, acct)
		if r.Claim != attemptapi.CodeNoToken {
			t.Errorf("the task's claim as the worker answered %q, want %s (it has no token to claim with)", r.Claim, attemptapi.CodeNoToken)
		}
		if strings.Contains(stdout.String(), cred.Token) {
			t.Error("the worker's token is in the task's output")
		}
	})
}

// TestRunAs: with Lite's run_as, the spawner's agent (reaperd's user)
// starts the task as the run_as user: the task sees that uid, cannot read
// a file of reaperd's user that only that user may read (the signing key,
// the configuration), nor its agent's environment and memory.
func TestRunAs(t *testing.T) {
	t.Run("TaskRunsAsTheRunAsUserAndCannotReadReaperdsFiles", func(t *testing.T) {
		acct := unprivileged(t)
		w := newWorld(t, acct)
		secret := filepath.Join(w.base, "signing-keys.hcl")
		if err := os.WriteFile(secret, []byte("current \"k\" { secret = \""+canary+"\" }\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		dir, err := records.Open(filepath.Join(w.base, "records"))
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		sp, err := literunner.NewSpawner(literunner.SpawnerConfig{AgentPath: filepath.Join(binDir, literunner.AgentBinary), Records: dir, RunAs: acct.Name})
		if err != nil {
			t.Fatal(err)
		}
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		ag, err := sp.Spawn(context.Background(), literunner.SpawnRequest{
			Invocation: agent.Invocation{Attempt: a, Command: "exec " + w.probe, Reporter: agent.ReporterFile,
				ReportFile: filepath.Join(w.base, "report.jsonl")},
			Env: []string{probeEnv + "=1", probeFileEnv + "=" + secret, attempttoken.EnvToken + "=rat1." + canary},
		})
		if err != nil {
			t.Fatal(err)
		}
		st, err := ag.Wait()
		if err != nil || !st.Success() {
			log, _ := os.ReadFile(ag.Log)
			t.Fatalf("the agent: %v %v\n%s", st, err, log)
		}
		data, err := os.ReadFile(ag.Output)
		if err != nil {
			t.Fatal(err)
		}
		r := parseProbe(t, string(data))
		t.Logf("the task (uid %d) under %s: reaperd's 0600 file %s, the agent's environ %s, mem %s", r.UID, r.ParentComm, r.File, r.Environ, r.Mem)
		if r.UID != acct.UID {
			t.Fatalf("the task ran as uid %d, want %s's %d", r.UID, acct.Name, acct.UID)
		}
		if !refusedErrno(r.File) {
			t.Errorf("reaperd's 0600 file: %s, want EACCES", r.File)
		}
		if !refusedErrno(r.Environ) || !refusedErrno(r.Mem) || r.Leak || len(r.EnvSecrets) != 0 {
			t.Errorf("the agent's environ %s, mem %s, leak %v, env %v: want both refused, nothing", r.Environ, r.Mem, r.Leak, r.EnvSecrets)
		}
	})
	t.Run("RootOrAnUnknownUserIsRefusedAtStart", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		dir, err := records.Open(filepath.Join(t.TempDir(), "records"))
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		for _, u := range []string{"root", "no-such-user-anywhere"} {
			_, err := literunner.NewSpawner(literunner.SpawnerConfig{AgentPath: filepath.Join(binDir, literunner.AgentBinary), Records: dir, RunAs: u})
			if err == nil || !strings.Contains(err.Error(), "run_as") {
				t.Errorf("run_as %s: %v, want refused", u, err)
			}
		}
	})
}
