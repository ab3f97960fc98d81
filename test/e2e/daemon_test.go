package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// daemon is one reaperd process and everything it logged, each line with
// the moment the test read it.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu   sync.Mutex
	logs []logLine
}

type logLine struct {
	at   time.Time
	text string
	ev   logEvent
}

// logEvent is what the suite reads from reaperd's JSON log lines.
type logEvent struct {
	Level    string `json:"@level"`
	Message  string `json:"@message"`
	Addr     string `json:"addr"`
	Decision string `json:"decision"`
	Applied  bool   `json:"applied"`
	Reaper   string `json:"reaper"`
	Task     string `json:"task"`
	Term     int64  `json:"term"`
	Write    string `json:"write"`
}

// startDaemon starts reaperd run on the scenario's configuration. Its
// environment carries the scenario's marker, which every plugin, agent and
// task inherits, so the scenario can find what is left of it in /proc.
func (s *scenario) startDaemon(config string) *daemon {
	s.t.Helper()
	d := &daemon{
		name: fmt.Sprintf("reaperd#%d", len(s.daemons)+1),
		cmd:  exec.Command(filepath.Join(binDir, "reaperd"), "run", "-config", config),
		done: make(chan struct{}),
	}
	d.cmd.Env = append(os.Environ(), "REAPER_DSN=", markEnv+"="+s.mark)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := logLine{at: time.Now(), text: sc.Text()}
			_ = json.Unmarshal([]byte(l.text), &l.ev)
			d.mu.Lock()
			d.logs = append(d.logs, l)
			d.mu.Unlock()
		}
		_ = d.cmd.Wait()
		close(d.done)
	}()
	s.daemons = append(s.daemons, d)
	s.t.Cleanup(func() { d.kill() })
	s.eventually(30*time.Second, d.name+" to serve its telemetry", func() bool { return d.telemetryAddr() != "" })
	return d
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// holds reports whether holder is the name the replica holds the board's
// lease under (host/pid/random: its prefix names the process).
func (d *daemon) holds(holder string) bool {
	host, _ := os.Hostname()
	return strings.HasPrefix(holder, fmt.Sprintf("%s/%d/", host, d.pid()))
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process (its plugins die with it).
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// freeze stops the process with SIGSTOP, as a long pause of the whole
// process (a stalled VM, a garbage collector's worst case) would: its
// timers, its connections and its plugins wait with it. Its plugins are
// processes of their own and run on. It returns once the kernel shows the
// process stopped.
func (d *daemon) freeze() error {
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("freeze %s: %w", d.name, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if stopped(d.pid()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze %s: not stopped 5s after SIGSTOP", d.name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopped reports whether /proc shows pid stopped by a signal.
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'T'
}

// thaw resumes a frozen process (SIGCONT); on a running one it does
// nothing.
func (d *daemon) thaw() error {
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil && !d.exited() {
		return fmt.Errorf("thaw %s: %w", d.name, err)
	}
	return nil
}

// stop sends SIGTERM and waits up to bound for a clean exit (a frozen
// process is thawed first, or the signal would wait with it).
func (d *daemon) stop(bound time.Duration) bool {
	_ = d.thaw()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return true
	case <-time.After(bound):
		d.kill()
		return false
	}
}

func (d *daemon) lines() []logLine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]logLine(nil), d.logs...)
}

func (d *daemon) tail(n int) string {
	ls := d.lines()
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// count counts log lines whose message is msg, read within [from, to]
// (a zero bound is open).
func (d *daemon) count(msg string, from, to time.Time) int {
	n := 0
	for _, l := range d.lines() {
		if l.ev.Message != msg {
			continue
		}
		if (!from.IsZero() && l.at.Before(from)) || (!to.IsZero() && l.at.After(to)) {
			continue
		}
		n++
	}
	return n
}

func (d *daemon) telemetryAddr() string {
	for _, l := range d.lines() {
		if l.ev.Message == "telemetry listening" {
			return l.ev.Addr
		}
	}
	return ""
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// health returns the status code of /monitor/health (0 when unreachable).
func (d *daemon) health() (int, string) {
	resp, err := httpClient.Get("http://" + d.telemetryAddr() + "/monitor/health")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// metric sums the samples of a metric whose labels contain every given
// `key="value"` pair; ok is false when /metrics could not be read.
func (d *daemon) metric(name string, labels ...string) (float64, bool) {
	resp, err := httpClient.Get("http://" + d.telemetryAddr() + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name) || len(line) == len(name) {
			continue
		}
		if c := line[len(name)]; c != '{' && c != ' ' {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, true
}

// passes is how many passes the daemon ran of a reaper.
func (d *daemon) passes(reaper string) float64 {
	v, _ := d.metric("reaper_pass_duration_seconds_count", `reaper="`+reaper+`"`)
	return v
}

// waitGateOpen waits until the daemon's settling gate has let a reaper run.
func (s *scenario) waitGateOpen(d *daemon, reaper string) {
	s.t.Helper()
	s.eventually(3*s.timing.grace, d.name+"'s settling gate to open", func() bool { return d.passes(reaper) >= 1 })
}

// killMidCycle kills the daemon with SIGKILL right after it starts a
// maintenance cycle, while that cycle's passes are under way.
func (s *scenario) killMidCycle(d *daemon) time.Time {
	s.t.Helper()
	last, ok := d.metric("reaper_last_cycle_timestamp_seconds")
	if !ok {
		s.t.Fatalf("%s: /metrics unreadable", d.name)
	}
	deadline := time.Now().Add(3 * s.timing.interval)
	for time.Now().Before(deadline) {
		if v, ok := d.metric("reaper_last_cycle_timestamp_seconds"); ok && v != last {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	at := time.Now()
	d.kill()
	return at
}

// appliedAfter lists the decisions the daemon logged as applied after at.
func (d *daemon) appliedAfter(at time.Time) []logLine {
	var out []logLine
	for _, l := range d.lines() {
		if l.ev.Message == "decision" && l.ev.Applied && l.at.After(at) {
			out = append(out, l)
		}
	}
	return out
}

// stepDownMsg is reaperd's line when the board's fence refused a write of
// the term it leads (host/daemon).
const stepDownMsg = "the board's fence refused a write of this replica's term: it no longer leads; stepping down"

// stepDowns lists the daemon's step-down lines.
func (d *daemon) stepDowns() []logLine {
	var out []logLine
	for _, l := range d.lines() {
		if l.ev.Message == stepDownMsg {
			out = append(out, l)
		}
	}
	return out
}

// passFailures counts the daemon's logged failures of reaper's passes: a
// pass that failed, or its plugin unavailable for the cycle.
func (d *daemon) passFailures(reaper string) int {
	n := 0
	for _, l := range d.lines() {
		if l.ev.Reaper == reaper && (l.ev.Message == "reaper pass failed" || l.ev.Message == "reaper unavailable this cycle") {
			n++
		}
	}
	return n
}

// passedCleanly reports whether the daemon ran a pass of reaper that did
// not fail since the baseline (passes, failures) was read: more passes
// metered than failures logged, the failures read again a moment later,
// since a failed pass is metered before its failure is logged.
func (d *daemon) passedCleanly(reaper string, passes float64, failures int) bool {
	ran := d.passes(reaper) - passes
	if ran <= float64(d.passFailures(reaper)-failures) {
		return false
	}
	time.Sleep(300 * time.Millisecond)
	return ran > float64(d.passFailures(reaper)-failures)
}
