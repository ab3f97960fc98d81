// Package loadproc runs a benchmark's load generator in a process of its
// own, so that the benchmark can tell the CPU the system under test spends
// from the CPU its load costs: the test binary is started again to run one
// named test (the generator), which reads its plan from a file an
// environment variable names and talks to the benchmark in lines, on its
// standard input (what to do) and standard output (what it saw, each of its
// own lines prefixed by a mark; the testing package's lines pass through).
//
// The benchmark's side is Start, then Next, Send and Wait; the generator's
// is ReadPlan and Say.
package loadproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Proc is a running load generator, seen from the benchmark.
type Proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
	mark  string
}

// Spec names the generator: Test is the test function the child runs, Env
// the environment variable that hands it the plan's file, Mark the prefix
// of its own lines.
type Spec struct {
	Test string
	Env  string
	Mark string
}

// Start writes plan (as JSON) to a file of tb's, starts the test binary
// again to run spec.Test with spec.Env naming that file, and waits for the
// generator's first line, which must be ready (it has, for instance, opened
// its connections). The process is killed at tb's cleanup if still running.
func Start(tb testing.TB, spec Spec, plan any, ready string) *Proc {
	tb.Helper()
	raw, err := json.Marshal(plan)
	if err != nil {
		tb.Fatalf("encoding the load's plan: %v", err)
	}
	path := filepath.Join(tb.TempDir(), "load-plan.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		tb.Fatalf("writing the load's plan: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+spec.Test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), spec.Env+"="+path)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatalf("the load generator's input: %v", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("the load generator's output: %v", err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting the load generator: %v", err)
	}
	p := &Proc{cmd: cmd, in: in, lines: bufio.NewScanner(out), mark: spec.Mark}
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	if l := p.Next(tb); l != ready {
		tb.Fatalf("the load generator said %q, not %s", l, ready)
	}
	return p
}

// Next is the generator's next line of its own, its mark cut; the lines
// of the testing package (a failure's) are passed on to standard error.
func (p *Proc) Next(tb testing.TB) string {
	tb.Helper()
	for p.lines.Scan() {
		if l, ok := strings.CutPrefix(p.lines.Text(), p.mark); ok {
			return l
		}
		fmt.Fprintf(os.Stderr, "load generator: %s\n", p.lines.Text())
	}
	tb.Fatalf("the load generator ended without its answer: %v", errors.Join(p.lines.Err(), p.cmd.Wait()))
	return ""
}

// Send tells the generator line.
func (p *Proc) Send(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		tb.Fatalf("telling the load generator %s: %v", line, err)
	}
}

// Outcome sends line and decodes the generator's next line, JSON, into v.
func (p *Proc) Outcome(tb testing.TB, line string, v any) {
	tb.Helper()
	p.Send(tb, line)
	if err := json.Unmarshal([]byte(p.Next(tb)), v); err != nil {
		tb.Fatalf("the load's outcome: %v", err)
	}
}

// Wait closes the generator's input (its sign to end) and waits for its
// exit, passing on the testing package's last lines but its PASS.
func (p *Proc) Wait(tb testing.TB) {
	tb.Helper()
	_ = p.in.Close()
	for p.lines.Scan() {
		if l := p.lines.Text(); l != "PASS" {
			fmt.Fprintf(os.Stderr, "load generator: %s\n", l)
		}
	}
	if err := p.cmd.Wait(); err != nil {
		tb.Fatalf("the load generator: %v", err)
	}
}

// ReadPlan is the generator's side: it decodes the plan the file env names
// into v. ok is false when env is unset (the test was not started as a
// generator and should skip).
func ReadPlan(env string, v any) (ok bool, err error) {
	path := os.Getenv(env)
	if path == "" {
		return false, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return true, fmt.Errorf("reading the load's plan: %w", err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("decoding the load's plan: %w", err)
	}
	return true, nil
}

// Say writes one line of the generator's own to w, behind mark.
func Say(w io.Writer, mark, line string) {
	fmt.Fprintf(w, "%s%s\n", mark, line)
}
