package literunner

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestDecideSpawnFailure(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	window := 15 * time.Minute
	missing := fmt.Errorf("spawning the agent: %w", &os.PathError{Op: "fork/exec", Path: "/x/reaper-agent", Err: syscall.ENOENT})
	short := fmt.Errorf("spawning the agent: %w", &os.PathError{Op: "fork/exec", Path: "/x/reaper-agent", Err: syscall.EAGAIN})
	full := fmt.Errorf("spawning the agent: recording the agent: %w", &os.PathError{Op: "write", Path: "/r/x.pid", Err: syscall.ENOSPC})
	cases := map[string]struct {
		err   error
		since time.Time
		want  spawnMove
	}{
		"AMissingBinaryFailsAtOnce":                   {err: missing, want: spawnFail},
		"AnErrorWithoutAnErrnoFailsAtOnce":            {err: fmt.Errorf("-command is required"), want: spawnFail},
		"AProcessShortageIsOfferedAgain":              {err: short, want: spawnOfferAgain},
		"AFullDiskIsOfferedAgain":                     {err: full, since: now.Add(-time.Minute), want: spawnOfferAgain},
		"AShortageThatLastedTheWindowFails":           {err: short, since: now.Add(-window), want: spawnExhausted},
		"AMissingBinaryFailsAtOnceEvenInsideAnOutage": {err: missing, since: now.Add(-time.Minute), want: spawnFail},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := decideSpawnFailure(c.err, c.since, now, window); got != c.want {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}
