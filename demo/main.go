// Command reaper-demo is `make demo`: it shows reaper doing its job on this
// machine, for real, in about a minute.
//
// It starts a throwaway PostgreSQL (unless REAPER_DSN names one), migrates
// it, starts reaperd with a shortened ladder and the Lite runner, submits a
// run of tasks that run as local processes, then kills some agents with
// kill -9 — some with their task still running, some together with it — and
// shows the reapers' decisions as they happen, a progress line, and a
// summary. It leaves nothing running and nothing behind; a demo killed half
// way is cleaned up by the next one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/internal/pgtest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/lite/proc"
)

const runID = "demo"

// The demo's tasks: six long ones (the ones harmed are among them) and four
// short ones.
var tasks = []string{
	"sleep 25", "sleep 25", "sleep 25", "sleep 25", "sleep 25", "sleep 25",
	"sleep 3", "sleep 4", "sleep 5", "sleep 6",
}

// harm says what the demo does to each long task once it runs.
var harm = map[string]string{
	"t1": "agent", "t2": "agent", "t3": "agent", // kill -9 the agent; its task lives on as an orphan
	"t4": "both", "t5": "both", // kill -9 the agent and its whole task group
}

const ladderHCL = `
leader "postgres" {
  lease = "3s"
}
maintenance {
  interval = "2s"
}
ladder {
  heartbeat      = "1s"
  agent_lost     = "5s"
  settling_grace = "8s"
  dispatch_lost  = "10s"
  orphan_run     = "20s"
}
telemetry {
  listen = "127.0.0.1:0"
}
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func run(ctx context.Context) int {
	start := time.Now()
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	bin := filepath.Dir(exe)
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("reaper-demo-%d", os.Getuid()))
	if cleanup(dir) {
		say("cleaned up what a previous demo left behind")
	}
	if err := os.MkdirAll(filepath.Join(dir, "records"), 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	_ = os.Chmod(dir, 0o755) // the database server's account needs to reach its directory
	defer cleanup(dir)

	dsn := os.Getenv("REAPER_DSN")
	if dsn == "" {
		say("starting a throwaway PostgreSQL from this machine's server binaries ...")
		srv, err := pgtest.Start(ctx, pgtest.Options{BaseDir: dir})
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		defer srv.Stop()
		if err := srv.CreateDatabase(ctx, "reaper", ""); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			return 1
		}
		dsn = srv.DSN("reaper")
	}
	cfgPath := filepath.Join(dir, "demo.hcl")
	cfg := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn = %q\n}\n%s\nsubstrate \"lite\" {\n  record_dir = %q\n  stop_grace = \"2s\"\n  kill_wait  = \"2s\"\n}\nrunner {\n  log_dir = %q\n}\nattempt_api {\n  listen    = \"127.0.0.1:0\"\n  state_dir = %q\n}\nreaper \"dispatchlost\" {}\nreaper \"agentlost\" {}\nreaper \"orphanrun\" {}\n",
		bin, dsn, ladderHCL, filepath.Join(dir, "records"), filepath.Join(dir, "records"), filepath.Join(dir, "attempt-api"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	env := append(os.Environ(), "REAPER_DSN=") // the file names the database
	for _, step := range [][]string{{"validate"}, {"migrate"}} {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "reaperd"), append(step, "-config", cfgPath)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: reaperd %s: %v\n%s", step[0], err, out)
			return 1
		}
		say("reaperd %s: %s", step[0], strings.TrimSpace(lastLine(string(out))))
	}

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer pool.Close()
	store := board.New(pool, board.Options{})

	say("starting reaperd (interval 2s, agent_lost 5s, settling grace 8s) ...")
	daemon := exec.Command(filepath.Join(bin, "reaperd"), "run", "-config", cfgPath)
	daemon.Env = env
	daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	logs, err := daemon.StderrPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	if err := daemon.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	daemonDone := make(chan struct{})
	events := make(chan string, 256)
	go follow(logs, events, start, filepath.Join(dir, "reaperd.log"))
	go func() { _ = daemon.Wait(); close(daemonDone) }()
	defer func() {
		_ = daemon.Process.Signal(syscall.SIGTERM)
		select {
		case <-daemonDone:
		case <-time.After(15 * time.Second):
			_ = daemon.Process.Kill()
			<-daemonDone
		}
	}()

	submit := exec.CommandContext(ctx, filepath.Join(bin, "reaperctl"),
		append([]string{"submit", "-config", cfgPath, "-run", runID, "--"}, tasks...)...)
	submit.Env = env
	if out, err := submit.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: reaperctl submit: %v\n%s", err, out)
		return 1
	}
	say("submitted run %q: %d tasks (t1-t6 sleep 25s, t7-t10 a few seconds)", runID, len(tasks))
	say("")

	harmed := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(3 * time.Minute)
	lastProgress := time.Time{}
	for {
		select {
		case <-ctx.Done():
			say("interrupted")
			return 130
		case <-daemonDone:
			fmt.Fprintln(os.Stderr, "demo: reaperd exited; its log is in", filepath.Join(dir, "reaperd.log"))
			return 1
		case ev := <-events:
			say("%s", ev)
			continue
		case <-tick.C:
		}
		tis, err := store.TaskInstances(ctx, runID)
		if err != nil {
			continue // the board may still be starting
		}
		for _, ti := range tis {
			if how, ok := harm[ti.TaskID]; ok && !harmed[ti.TaskID] && ti.State == sdk.StateRunning &&
				ti.Try == 1 && ti.Epoch == 0 && !ti.RunningAt.IsZero() && time.Since(ti.RunningAt) > 3*time.Second {
				if msg, err := kill(ti.Attempt, how); err == nil {
					harmed[ti.TaskID] = true
					say("%6.1fs  FAULT      %s", time.Since(start).Seconds(), msg)
				}
			}
		}
		if time.Since(lastProgress) >= 3*time.Second {
			lastProgress = time.Now()
			say("%6.1fs  progress   %s", time.Since(start).Seconds(), progress(tis))
		}
		r, err := store.Run(ctx, runID)
		if err == nil && (r.State == sdk.RunSuccess || r.State == sdk.RunFailed) {
			time.Sleep(300 * time.Millisecond) // let the last log lines through
			for len(events) > 0 {
				say("%s", <-events)
			}
			say("")
			say("run %q finished %s after %.0fs", runID, r.State, time.Since(start).Seconds())
			code := summary(ctx, store, pool, start)
			// What an operator would ask next: why was t1 reaped?
			explain := exec.CommandContext(ctx, filepath.Join(bin, "reaperctl"), "explain", "-config", cfgPath, runID, "t1")
			explain.Env = env
			if out, err := explain.CombinedOutput(); err == nil {
				say("\n$ reaperctl explain %s t1\n%s", runID, strings.TrimRight(string(out), "\n"))
			}
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "demo: the run did not finish in 3 minutes; reaperd's log:", filepath.Join(dir, "reaperd.log"))
			return 1
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// follow turns reaperd's JSON log into readable event lines (applied
// decisions of the reapers, the runner's re-places, the gate) and keeps the
// whole log in a file.
func follow(r io.Reader, events chan<- string, start time.Time, path string) {
	f, _ := os.Create(path)
	if f != nil {
		defer f.Close()
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f != nil {
			fmt.Fprintln(f, line)
		}
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		msg, _ := ev["@message"].(string)
		decision, _ := ev["decision"].(string)
		at := time.Since(start).Seconds()
		switch {
		case msg == "gained leadership":
			events <- fmt.Sprintf("%6.1fs  LEADER     reaperd leads (term %v); reapers wait out the settling grace", at, ev["term"])
		case msg == "decision" && ev["applied"] == true:
			events <- fmt.Sprintf("%6.1fs  REAPED     %-12v %-28s %s/%v try=%v epoch=%v (agent %v, group %v)",
				at, ev["reaper"], decision, ev["run"], ev["task"], ev["try"], ev["epoch"], ev["agent"], ev["group"])
		case decision == "infra_replace":
			events <- fmt.Sprintf("%6.1fs  RE-PLACED  runner       %-28s %v -> %v", at, decision, ev["attempt"], ev["next"])
		case strings.Contains(msg, "settling valve"):
			events <- fmt.Sprintf("%6.1fs  WARN       %s", at, msg)
		}
	}
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

func progress(tis []board.TaskInstance) string {
	counts := map[string]int{}
	for _, ti := range tis {
		counts[ti.State]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, counts[k])
	}
	return "tasks: " + strings.Join(parts, " ")
}

// summary prints the table of what happened, from the board and its audit.
func summary(ctx context.Context, store *board.Store, pool *pgxpool.Pool, start time.Time) int {
	tis, err := store.TaskInstances(ctx, runID)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	type count struct {
		label string
		n     int
	}
	var reaped, replaced, touched int
	rows, err := pool.Query(ctx, `SELECT label, task_id, applied FROM reap_decisions WHERE run_id = $1`, runID)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	for rows.Next() {
		var label, task string
		var applied bool
		if err := rows.Scan(&label, &task, &applied); err != nil {
			break
		}
		if !applied {
			continue
		}
		switch label {
		case sdk.LabelAgentLost, sdk.LabelDispatchLost, sdk.LabelAgentLostNeverHeartbeated, sdk.LabelCredentialCeiling,
			sdk.LabelAgentLostOrphanStopped, sdk.LabelDispatchLostOrphanStopped:
			reaped++
			if _, ok := harm[task]; !ok {
				touched++ // a live, unharmed attempt was marked: must never happen
			}
		case "infra_replace":
			replaced++
		}
	}
	rows.Close()
	attempts, succeeded := 0, 0
	for _, ti := range tis {
		attempts += int(ti.Try) + int(ti.Epoch) // every try and every re-placed epoch was an attempt
		if ti.State == sdk.StateSuccess {
			succeeded++
		}
		if _, ok := harm[ti.TaskID]; !ok && (ti.Try != 1 || ti.Epoch != 0) {
			touched++
		}
	}
	say("")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SUMMARY\t")
	for _, c := range []count{
		{"tasks", len(tis)}, {"attempts", attempts}, {"faults injected", len(harm)},
		{"reaped", reaped}, {"re-placed", replaced}, {"succeeded", succeeded},
		{"live attempts touched", touched},
	} {
		fmt.Fprintf(w, "  %s\t%d\n", c.label, c.n)
	}
	fmt.Fprintf(w, "  wall time\t%.0fs\n", time.Since(start).Seconds())
	w.Flush()
	if touched != 0 || succeeded != len(tis) {
		say("\nsomething went wrong: see the log above")
		return 1
	}
	say("\nevery lost attempt was recovered and no live attempt was touched.")
	return 0
}
