package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

const runID = "demo"

// The Lite demo's tasks: six long ones (the ones harmed are among them) and
// four short ones.
var tasks = []string{
	"sleep 25", "sleep 25", "sleep 25", "sleep 25", "sleep 25", "sleep 25",
	"sleep 3", "sleep 4", "sleep 5", "sleep 6",
}

// harm says what the Lite demo does to each long task once it runs.
var harm = map[string]string{
	"t1": "agent", "t2": "agent", "t3": "agent", // kill -9 the agent; its task lives on as an orphan
	"t4": "both", "t5": "both", // kill -9 the agent and its whole task group
}

// demoLadder is the shortened timing ladder of both demos, with the
// edition's own keys (extra) added to its ladder block.
func demoLadder(extra string) string {
	return `
maintenance {
  interval = "2s"
}
ladder {
  heartbeat      = "1s"
  agent_lost     = "5s"
  settling_grace = "8s"
  dispatch_lost  = "10s"
  orphan_run     = "20s"
` + extra + `}
`
}

const liteLeaderHCL = `
leader "postgres" {
  lease = "3s"
}
telemetry {
  listen = "127.0.0.1:0"
}
`

func runLite(ctx context.Context, bin string) int {
	s, err := open(ctx, "reaper-demo", bin)
	if err != nil {
		return fail(err)
	}
	defer s.close()
	records := filepath.Join(s.dir, "records")
	cfgPath := filepath.Join(s.dir, "demo.hcl")
	cfg := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn = %q\n}\n%s\nsubstrate \"lite\" {\n  record_dir = %q\n  stop_grace = \"2s\"\n  kill_wait  = \"2s\"\n}\nrunner {\n  log_dir = %q\n}\nattempt_api {\n  listen    = \"127.0.0.1:0\"\n  state_dir = %q\n}\nreaper \"dispatchlost\" {}\nreaper \"agentlost\" {}\nreaper \"orphanrun\" {}\n",
		s.bin, s.dsn, liteLeaderHCL+demoLadder(""), records, records, filepath.Join(s.dir, "attempt-api"))
	if err := s.prepare(ctx, cfgPath, cfg); err != nil {
		return fail(err)
	}

	say("starting reaperd (interval 2s, agent_lost 5s, settling grace 8s) ...")
	daemon, err := s.startReaperd(cfgPath, "")
	if err != nil {
		return fail(err)
	}

	submit := exec.CommandContext(ctx, filepath.Join(s.bin, "reaperctl"),
		append([]string{"submit", "-config", cfgPath, "-run", runID, "--"}, tasks...)...)
	submit.Env = s.env()
	if out, err := submit.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("reaperctl submit: %w\n%s", err, out))
	}
	say("submitted run %q: %d tasks (t1-t6 sleep 25s, t7-t10 a few seconds)", runID, len(tasks))
	say("")

	harmed := map[string]bool{}
	alive := func() bool {
		select {
		case <-daemon.done:
			return false
		default:
			return true
		}
	}
	code := s.watch(ctx, []string{runID}, 3*time.Minute, alive, func(tis []board.TaskInstance) {
		for _, ti := range tis {
			if how, ok := harm[ti.TaskID]; ok && !harmed[ti.TaskID] && ti.State == sdk.StateRunning &&
				ti.Try == 1 && ti.Epoch == 0 && !ti.RunningAt.IsZero() && time.Since(ti.RunningAt) > 3*time.Second {
				if msg, err := kill(ti.Attempt, how); err == nil {
					harmed[ti.TaskID] = true
					say("%6.1fs  FAULT      %s", s.at(), msg)
				}
			}
		}
	})
	if code != 0 {
		return code
	}
	code = liteSummary(ctx, s)
	s.explain(ctx, runID, "t1") // why was t1 reaped?
	return code
}

// kill injects a fault into one attempt: kill -9 its agent, and with "both"
// its task's whole process group too.
func kill(a sdk.Attempt, how string) (string, error) {
	agent, task, err := findAgent(a)
	if err != nil {
		return "", err
	}
	if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
		return "", err
	}
	if how == "both" && task > 0 {
		_ = syscall.Kill(-task, syscall.SIGKILL)
		return fmt.Sprintf("kill -9 agent %d and task group %d of %s (both gone)", agent, task, a), nil
	}
	return fmt.Sprintf("kill -9 agent %d of %s (its task keeps running as an orphan)", agent, a), nil
}

// findAgent finds the agent process of an attempt (by its command line) and
// its task (the agent's child, leader of its own group) by scanning /proc.
func findAgent(a sdk.Attempt) (agent, task int, err error) {
	want := fmt.Sprintf("-run=%s\x00-task=%s\x00-try=%d\x00-epoch=%d\x00", a.RunID, a.TaskID, a.Try, a.Epoch)
	procs, _ := os.ReadDir("/proc")
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		pids = append(pids, pid)
		if cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline")); err == nil &&
			strings.Contains(string(cmd), "reaper-agent") && strings.Contains(string(cmd), want) {
			agent = pid
		}
	}
	if agent == 0 {
		return 0, 0, errors.New("agent not found")
	}
	for _, pid := range pids {
		if info, err := proc.Stat(pid); err == nil && info.PPID == agent {
			task = pid
		}
	}
	return agent, task, nil
}

// liteSummary prints the table of what happened, from the board and its
// audit.
func liteSummary(ctx context.Context, s *session) int {
	tis, ds, err := s.outcome(ctx, runID)
	if err != nil {
		return fail(err)
	}
	var reaped, replaced, touched int
	for _, d := range ds {
		switch d.label {
		case sdk.LabelAgentLost, sdk.LabelDispatchLost, sdk.LabelAgentLostNeverHeartbeated, sdk.LabelCredentialCeiling,
			sdk.LabelAgentLostOrphanStopped, sdk.LabelDispatchLostOrphanStopped:
			reaped++
			if _, ok := harm[d.attempt.TaskID]; !ok {
				touched++ // a live, unharmed attempt was marked: must never happen
			}
		case sdk.LabelInfraReplace:
			replaced++
		}
	}
	succeeded := 0
	for _, ti := range tis {
		if ti.State == sdk.StateSuccess {
			succeeded++
		}
		if _, ok := harm[ti.TaskID]; !ok && (ti.Try != 1 || ti.Epoch != 0) {
			touched++
		}
	}
	s.printSummary([]count{
		{"tasks", len(tis)}, {"attempts", attempts(tis)}, {"faults injected", len(harm)},
		{"reaped", reaped}, {"re-placed", replaced}, {"succeeded", succeeded},
		{"live attempts touched", touched},
	})
	if touched != 0 || succeeded != len(tis) {
		say("\nsomething went wrong: see the lines above and reaperd's log in %s", s.keepLogs())
		return 1
	}
	say("\nevery lost attempt was recovered and no live attempt was touched.")
	return 0
}
