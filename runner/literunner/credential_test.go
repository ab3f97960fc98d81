package literunner_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// secretDSN is a database connection string placed in the runner's own
// environment (as REAPER_DSN, reaperd's override, and as libpq's password
// variable): no agent and no task may see it.
const (
	secretDSN      = "postgres://reaper:s3cret-board-password@127.0.0.1:5432/reaper"
	secretPassword = "s3cret-board-password"
)

var envName = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// readEnvFile reads NAME=VALUE lines.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var last string
	for sc.Scan() {
		line := sc.Text()
		if k, v, ok := strings.Cut(line, "="); ok && envName.MatchString(k) {
			env[k], last = v, k
		} else if last != "" { // a multi-line value (the CA's PEM)
			env[last] += "\n" + line
		}
	}
	return env
}

// The runner's environment holds the board's credentials; tasks read their
// agent's environment and memory map, and use its token.
func TestAgentCredentials(t *testing.T) {
	t.Setenv("REAPER_DSN", secretDSN)
	t.Setenv("PGPASSWORD", secretPassword)
	ctx := context.Background()
	b := setup(t, opts{})
	work := b.work
	spy := `tr '\0' '\n' < /proc/$PPID/environ > ` + work + `/agent.env && cat /proc/$PPID/maps > ` + work +
		`/agent.maps && env > ` + work + `/task.env`
	wait := `while [ ! -f ` + work + `/go ]; do sleep 0.05; done`
	b.mkRun(t, "run", task("spy", spy, 0), task("victim", wait, 0))
	b.mkRun(t, "other", task("victim", wait, 0))

	// Until the spy has finished and both victims run.
	if !eventually.Until(30*time.Second, func() bool {
		b.cycle(t)
		return b.ti(t, "run", "spy").State == sdk.StateSuccess && b.ti(t, "run", "victim").State == sdk.StateRunning &&
			b.ti(t, "other", "victim").State == sdk.StateRunning
	}, eventually.Every(20*time.Millisecond)) {
		t.Fatalf("spy %s, victims %s / %s", show(b.ti(t, "run", "spy")), show(b.ti(t, "run", "victim")),
			show(b.ti(t, "other", "victim")))
	}
	agentEnv := readEnvFile(t, filepath.Join(work, "agent.env"))

	t.Run("ATaskReadingItsAgentsEnvironAndMapsFindsNoDatabaseCredentials", func(t *testing.T) {
		if agentEnv[attempttoken.EnvToken] == "" {
			t.Fatalf("the spy did not read its agent's environment: %v", agentEnv)
		}
		raw, _ := os.ReadFile(filepath.Join(work, "agent.env"))
		for _, secret := range []string{secretDSN, secretPassword, "REAPER_DSN", "PGPASSWORD", "postgres://"} {
			if bytes.Contains(raw, []byte(secret)) {
				t.Errorf("the agent's environment holds %q", secret)
			}
		}
		maps, err := os.ReadFile(filepath.Join(work, "agent.maps"))
		if err != nil || len(maps) == 0 {
			t.Fatalf("the spy did not read its agent's maps: %v", err)
		}
		files := map[string]bool{}
		for _, line := range strings.Split(string(maps), "\n") {
			if f := strings.Fields(line); len(f) >= 6 && strings.HasPrefix(f[5], "/") {
				files[f[5]] = true
			}
		}
		for f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue // gone, or not readable: not readable by the task either
			}
			if bytes.Contains(data, []byte(secretPassword)) {
				t.Errorf("a file mapped by the agent holds the board's password: %s", f)
			}
		}
		task := readEnvFile(t, filepath.Join(work, "task.env"))
		for _, k := range []string{attempttoken.EnvToken, attempttoken.EnvAPI, attempttoken.EnvCA, "REAPER_DSN", "PGPASSWORD"} {
			if _, ok := task[k]; ok {
				t.Errorf("the task's own environment holds %s", k)
			}
		}
	})

	// What a task finds in its agent's environment is the attempt's
	// bootstrap token, which the agent exchanged before RUNNING: a second
	// exchange is refused, and the spent token is accepted by no other call,
	// for its own attempt or any other.
	t.Run("TheTokenInItsAgentsEnvironmentIsASpentBootstrap_WorthNothing", func(t *testing.T) {
		if !attempttoken.IsBootstrap(agentEnv[attempttoken.EnvToken]) {
			t.Fatalf("the agent's environment holds a %.4s token, want the bootstrap", agentEnv[attempttoken.EnvToken])
		}
		c, err := attemptapi.ClientFromEnv(func(k string) string { return agentEnv[k] })
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		spyAttempt := sdk.Attempt{RunID: "run", TaskID: "spy", Try: 1}
		targets := map[string]sdk.Attempt{
			"ItsOwnAttempt":       spyAttempt,
			"AnotherTaskOfTheRun": b.ti(t, "run", "victim").Attempt,
			"AnotherRun":          b.ti(t, "other", "victim").Attempt,
			"AnotherTry":          {RunID: "run", TaskID: "spy", Try: 2},
			"AnotherEpoch":        {RunID: "run", TaskID: "spy", Try: 1, Epoch: 1},
		}
		before := map[string]board.TaskInstance{}
		for _, k := range []string{"run/spy", "run/victim", "other/victim"} {
			run, task, _ := strings.Cut(k, "/")
			before[k] = b.ti(t, run, task)
		}
		for _, k := range []string{"run/spy", "run/victim", "other/victim"} {
			run, task, _ := strings.Cut(k, "/")
			a := b.ti(t, run, task).Attempt
			_, err := c.Exchange(ctx, a)
			if a == spyAttempt {
				wantRefused(t, k+" exchange", err, attemptapi.CodeBootstrapSpent)
			} else {
				wantRefused(t, k+" exchange", err, attemptapi.CodeWrongScope)
			}
		}
		for name, a := range targets {
			_, err := c.Heartbeat(ctx, a)
			wantRefused(t, name+" heartbeat", err, attemptapi.CodeWrongKind)
			_, err = c.Report(ctx, a, attemptapi.ReportBody{State: sdk.StateFailed, Reason: "spy"})
			wantRefused(t, name+" report", err, attemptapi.CodeWrongKind)
			_, err = c.Running(ctx, a)
			wantRefused(t, name+" running", err, attemptapi.CodeWrongKind)
			_, err = c.State(ctx, a)
			wantRefused(t, name+" state", err, attemptapi.CodeWrongKind)
		}
		for k, was := range before {
			run, task, _ := strings.Cut(k, "/")
			// Heartbeats of the real victims' agents may move their stamps.
			now := b.ti(t, run, task)
			now.LastHeartbeatAt, now.UpdatedAt, now.CredentialRenewedAt = was.LastHeartbeatAt, was.UpdatedAt, was.CredentialRenewedAt
			if now != was {
				t.Errorf("%s changed:\nwas %s\nnow %s", k, show(was), show(now))
			}
		}
	})

	t.Run("DispatchRecordsTheCredentialsMintTime_TheExchangeKeepsIt", func(t *testing.T) {
		ti := b.ti(t, "run", "victim")
		if ti.CredentialMintedAt.IsZero() || !ti.CredentialMintedAt.Equal(ti.QueuedAt) {
			t.Fatalf("minted %v, queued %v", ti.CredentialMintedAt, ti.QueuedAt)
		}
	})

	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var tt totals
	b.untilRunEnds(t, "run", &tt, nil)
	b.untilRunEnds(t, "other", &tt, nil)
}

func wantRefused(t *testing.T, what string, err error, code string) {
	t.Helper()
	var ce *attemptapi.CallError
	if !errors.As(err, &ce) || ce.Body.Code != code {
		t.Errorf("%s: err %v, want refused %s", what, err, code)
	}
}

// minterFunc adapts a function to literunner.Minter.
type minterFunc func(a sdk.Attempt, now time.Time) (attempttoken.Credential, error)

func (f minterFunc) Mint(a sdk.Attempt, now time.Time) (attempttoken.Credential, error) {
	return f(a, now)
}

// agentLogSaid returns how many times the agents' own logs hold line.
func (b *bundle) agentLogSaid(t *testing.T, line string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(b.agentLogs, "*.agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n += bytes.Count(data, []byte(line))
	}
	return n
}

// untilAgentLogSays waits until the agents' logs hold line n times more
// than they did at said: the agent, a process of its own, says so when a
// call to the attempt API failed.
func (b *bundle) untilAgentLogSays(t *testing.T, line string, said, n int) {
	t.Helper()
	eventually.True(t, 30*time.Second, fmt.Sprintf("the agent to log %q %d times", line, n), func() bool {
		return b.agentLogSaid(t, line) >= said+n
	}, eventually.Every(20*time.Millisecond))
}

// The attempt API goes down (reaperd stopped) before the agent's RUNNING
// report, again while its task runs, and again when it reports: the agent
// rides out each outage (pre-start retry, heartbeat retries, report retry)
// and its attempt ends as if nothing had happened.
func TestAgentRidesOutAnAttemptAPIOutage(t *testing.T) {
	t.Parallel()
	addr := attemptapitest.FreeAddr(t)
	state := filepath.Join(t.TempDir(), "attempt-api")
	var api *attemptapitest.API
	b := setup(t, opts{heartbeat: 500 * time.Millisecond, credentials: minterFunc(
		func(a sdk.Attempt, now time.Time) (attempttoken.Credential, error) { return api.Issuer.Mint(a, now) })})
	start := func() { api = attemptapitest.Start(t, b.w, attemptapitest.Options{Listen: addr, StateDir: state}) }
	start()
	api.Stop() // down before the dispatch

	started, release := filepath.Join(b.work, "started"), filepath.Join(b.work, "go")
	b.mkRun(t, "run", task("t", `touch `+started+`; while [ ! -f `+release+` ]; do sleep 0.05; done`, 0))
	if res := b.cycle(t); res.Dispatched != 1 {
		t.Fatalf("dispatch: %+v", res)
	}

	t.Run("PreStartRetryRidesOutTheOutage", func(t *testing.T) {
		// The agent has tried RUNNING against nothing twice, and retries.
		b.untilAgentLogSays(t, "running report failed; retrying", 0, 2)
		if ti := b.ti(t, "run", "t"); ti.State != sdk.StateQueued {
			t.Fatalf("state %s while the API is down", ti.State)
		}
		if _, err := os.Stat(started); err == nil {
			t.Fatal("the task started before RUNNING was accepted")
		}
		start()
		eventually.True(t, 30*time.Second, "the attempt running after the API came back", func() bool {
			_, err := os.Stat(started)
			return b.ti(t, "run", "t").State == sdk.StateRunning && err == nil
		})
	})

	t.Run("HeartbeatsAndTheReportRideOutTheOutage", func(t *testing.T) {
		eventually.True(t, 30*time.Second, "a recorded heartbeat", func() bool {
			return !b.ti(t, "run", "t").LastHeartbeatAt.IsZero()
		})
		beats := b.agentLogSaid(t, "heartbeat failed")
		api.Stop()
		b.untilAgentLogSays(t, "heartbeat failed", beats, 2) // heartbeats fail meanwhile
		if err := os.WriteFile(release, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		b.untilAgentLogSays(t, "terminal report failed; retrying", 0, 1) // the report fails meanwhile
		if ti := b.ti(t, "run", "t"); ti.State != sdk.StateRunning {
			t.Fatalf("state %s while the API is down", ti.State)
		}
		start()
		eventually.True(t, 30*time.Second, "the outcome reported after the API came back", func() bool {
			return b.ti(t, "run", "t").State == sdk.StateSuccess
		})
	})
	var tt totals
	if run := b.untilRunEnds(t, "run", &tt, nil); run.State != sdk.RunSuccess {
		t.Fatalf("run %+v", run)
	}
}
