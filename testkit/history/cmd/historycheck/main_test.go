package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/history"
)

// record writes events to a history file in dir and returns its path.
func record(t *testing.T, dir, name string, events ...history.Event) string {
	t.Helper()
	path := filepath.Join(dir, name)
	w, err := history.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := w.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	a := &history.Attempt{RunID: "run-1", TaskID: "a", Try: 1, Epoch: 0}
	write := func(ms int, term int64, holder, outcome, state string) history.Event {
		return history.Event{Time: t0.Add(time.Duration(ms) * time.Millisecond), Kind: history.KindWrite, Op: "mark",
			Term: term, Holder: holder, Attempt: a, Outcome: outcome, State: state}
	}
	finalRow := history.Event{Time: t0.Add(time.Second), Kind: history.KindFinal, Attempt: a, State: "failed"}

	good := record(t, dir, "good.history",
		history.Event{Time: t0, Kind: history.KindExecStart, Attempt: a, Exec: "pod-1"},
		write(10, 1, "replica-1", history.OutcomeApplied, "failed"),
		history.Event{Time: t0.Add(20 * time.Millisecond), Kind: history.KindExecEnd, Exec: "pod-1", Outcome: history.OutcomeKilled},
		write(30, 1, "replica-1", history.OutcomeDeposed, "failed"),
		finalRow)
	bad := record(t, dir, "bad.history",
		write(10, 2, "replica-2", history.OutcomeApplied, "failed"),
		write(20, 1, "replica-1", history.OutcomeApplied, "failed"),
		finalRow)
	garbled := filepath.Join(dir, "garbled.history")
	if err := os.WriteFile(garbled, []byte("{\"time\":\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.history")

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout []string // lines, in order
		stderr string   // a word stderr holds ("" for none)
	}{
		{
			name: "a clean history", args: []string{good}, code: 0,
			stdout: []string{good + ": history: 5 events, 1 writes applied, 1 refused (1 by the fence), 1 executions, 1 terms; violations: 0"},
		},
		{
			name: "a history with a violation", args: []string{good, bad}, code: 1,
			stdout: []string{
				good + ": history: 5 events",
				bad + ": history: 3 events, 2 writes applied, 0 refused (0 by the fence), 0 executions, 2 terms; violations: 1",
				`  stale_term: term 1 (holder "replica-1")`,
			},
		},
		{
			name: "an unreadable file among good ones", args: []string{bad, garbled, good}, code: 2,
			stdout: []string{bad + ": ", "  stale_term: ", good + ": "},
			stderr: "historycheck: history: read " + garbled + ": line 1",
		},
		{name: "a missing file", args: []string{missing}, code: 2, stderr: "no such file"},
		{name: "no file", args: nil, code: 2, stderr: "usage: historycheck FILE..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, &stdout, &stderr); code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, &stdout, &stderr)
			}
			lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
			if stdout.Len() == 0 {
				lines = nil
			}
			if len(lines) != len(tc.stdout) {
				t.Fatalf("stdout has %d lines, want %d:\n%s", len(lines), len(tc.stdout), &stdout)
			}
			for i, want := range tc.stdout {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("stdout line %d:\n%s\nwant it to begin\n%s", i+1, lines[i], want)
				}
			}
			if tc.stderr == "" && stderr.Len() > 0 || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q, want it to hold %q", &stderr, tc.stderr)
			}
		})
	}
}
