package agent

import (
	"slices"
	"testing"

	"github.com/dexaflow/reaper/runner/attempttoken"
)

func TestTaskEnvironDropsTheBoardCredentials(t *testing.T) {
	got := taskEnviron([]string{"PATH=/bin", "REAPER_DSN=postgres://u:secret@h/db", "HOME=/root"})
	if slices.ContainsFunc(got, func(kv string) bool { return kv == "REAPER_DSN=postgres://u:secret@h/db" }) {
		t.Fatalf("the task would inherit REAPER_DSN: %v", got)
	}
	if len(got) != 2 {
		t.Fatalf("environment = %v", got)
	}
}

func TestTaskEnvironDropsTheAgentJournal(t *testing.T) {
	got := taskEnviron([]string{"PATH=/bin", JournalDirEnv + "=/j"})
	if len(got) != 1 || got[0] != "PATH=/bin" {
		t.Fatalf("the task would inherit the agent's journal: %v", got)
	}
}

func TestTaskEnvironDropsTheWorkerToken(t *testing.T) {
	got := taskEnviron([]string{"PATH=/bin", attempttoken.EnvWorkerToken + "=rwt1.k.p.m"})
	if len(got) != 1 || got[0] != "PATH=/bin" {
		t.Fatalf("a warm task would inherit its worker's credential: %v", got)
	}
}
