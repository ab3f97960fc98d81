// Package tasksecrets_test proves that a task cannot take its agent's (or
// its warm worker's) credential: the real reaper-agent binary, run as a
// non-root user in each of its modes, starts a real task (this test binary
// re-run as a probe) as that same user, and the probe tries every way a
// task of the same uid has to the agent's secrets: its own environment, the
// agent's /proc/<pid>/environ and /proc/<pid>/mem, and, as a warm task, a
// claim of the worker's attempts. With Lite's run_as the task runs as yet
// another user and cannot read reaperd's files either.
//
// The tests need root: to run the agent and its task as an unprivileged
// user (nobody), as reaperd runs them on a host where it is not root.
package tasksecrets_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/testbin"
	"github.com/dexaflow/reaper/testkit/unpriv"
)

// binDir holds the reaper-agent binary TestMain builds. Set once, before
// any test runs.
var binDir string

// Environment of the probe: set, this binary is a task's probe, not a test.
const (
	probeEnv = "TASKSECRETS_PROBE"
	// probeControlEnv names a pid of the probe's user that is dumpable:
	// reading its environ shows the probe could read an agent that had not
	// made itself non-dumpable.
	probeControlEnv = "TASKSECRETS_CONTROL_PID"
	// probeFileEnv names a file of reaperd's user, mode 0600.
	probeFileEnv = "TASKSECRETS_FILE"
	// probeAPIEnv, probeCAEnv and probeWorkerEnv: where a warm task would
	// claim, and as which worker (the API's address is not given to tasks;
	// the test hands it to the probe so that the probe can try).
	probeAPIEnv    = "TASKSECRETS_API"
	probeCAEnv     = "TASKSECRETS_CA"
	probeWorkerEnv = "TASKSECRETS_WORKER"
)

// canary is the secret value the tests put in the agents' environments.
const canary = "canary-secret-4f1d"

func TestMain(m *testing.M) {
	if os.Getenv(probeEnv) != "" {
		os.Exit(probe())
	}
	os.Exit(testbin.Main(m, "tasksecrets", []string{"github.com/dexaflow/reaper/cmd/reaper-agent"},
		func(m *testing.M, bin string) int {
			binDir = bin
			// The agent runs as an unprivileged user: it must reach its binary.
			if err := os.Chmod(bin, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			return pgtest.Run(m)
		}))
}

// probeResult is what the probe prints, on one line after probeMark.
type probeResult struct {
	UID        int
	PPID       int
	ParentComm string
	// EnvSecrets names the credential variables in the task's environment.
	EnvSecrets []string
	// Environ and Mem are what reading the parent's /proc files gave: an
	// errno name, or "read" (Leak: the canary was in what was read).
	Environ, Mem string
	Leak         bool
	// Control is what reading the control process's environ gave.
	Control string
	// File is what reading probeFileEnv's file gave.
	File string
	// Claim is what a claim as the worker answered ("" when not tried).
	Claim string
	// Caps: the task's own CapEff, CapPrm and CapAmb, and its parent's
	// (the agent's) CapEff, as /proc shows them; Setuid: what switching to
	// each uid of probeSetuidEnv gave ("became" or an errno name). Set
	// only when probeSetuidEnv is.
	Caps   map[string]string
	Setuid map[string]string
}

const probeMark = "PROBE "

func errnoOf(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// readProc reads a /proc file and says what happened.
func readProc(path string, r *probeResult) string {
	f, err := os.Open(path)
	if err != nil {
		return errnoOf(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if strings.Contains(string(b), canary) {
		r.Leak = true
	}
	if err != nil && len(b) == 0 {
		return "opened, then " + errnoOf(err)
	}
	return "read"
}

func probe() int {
	r := probeResult{UID: os.Getuid(), PPID: os.Getppid()}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", r.PPID)); err == nil {
		r.ParentComm = strings.TrimSpace(string(b))
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case attempttoken.EnvToken, attempttoken.EnvWorkerToken, attempttoken.EnvAPI, attempttoken.EnvCA, "REAPER_DSN":
			r.EnvSecrets = append(r.EnvSecrets, k)
		}
		if strings.Contains(kv, canary) {
			r.Leak = true
		}
	}
	r.Environ = readProc(fmt.Sprintf("/proc/%d/environ", r.PPID), &r)
	r.Mem = readProc(fmt.Sprintf("/proc/%d/mem", r.PPID), &r)
	if pid := os.Getenv(probeControlEnv); pid != "" {
		var c probeResult
		r.Control = readProc("/proc/"+pid+"/environ", &c)
		if !c.Leak {
			r.Control += " (no canary)"
		}
	}
	if path := os.Getenv(probeFileEnv); path != "" {
		if _, err := os.ReadFile(path); err != nil {
			r.File = errnoOf(err)
		} else {
			r.File = "read"
		}
	}
	if api := os.Getenv(probeAPIEnv); api != "" {
		r.Claim = claimAsWorker(api, os.Getenv(probeCAEnv), os.Getenv(probeWorkerEnv), os.Getenv(attempttoken.EnvWorkerToken))
	}
	if uids := os.Getenv(probeSetuidEnv); uids != "" {
		probeCaps(&r, uids)
	}
	b, _ := json.Marshal(r)
	fmt.Println(probeMark + string(b))
	return 0
}

// claimAsWorker is the best a warm task can do: claim the worker's
// attempts with whatever worker token its environment holds (none: the
// call goes without one). It returns the API's error code, or "claimed N".
func claimAsWorker(api, caPEM, worker, token string) string {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(caPEM))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	body, _ := json.Marshal(attemptapi.Request{Worker: worker, Slots: 10})
	req, err := http.NewRequest(http.MethodPost, strings.TrimSuffix(api, "/")+attemptapi.PathClaim, bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb attemptapi.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return eb.Code
	}
	var got attemptapi.Response
	_ = json.NewDecoder(resp.Body).Decode(&got)
	return "claimed " + strconv.Itoa(len(got.Attempts))
}

// parseProbe finds the probe's line in a task's output.
func parseProbe(t *testing.T, out string) probeResult {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), probeMark); ok {
			var r probeResult
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatalf("probe line %q: %v", rest, err)
			}
			return r
		}
	}
	t.Fatalf("no probe line in the task's output:\n%s", out)
	return probeResult{}
}

// account is an unprivileged user.
type account = unpriv.Account

// unprivileged is the user the agents and tasks run as. It skips the test
// when not root.
func unprivileged(t *testing.T) account { return unpriv.Find(t) }

// world is a test's scratch: base (0755, root's) holds the probe binary;
// work (0700) belongs to the user the agent runs as.
type world struct {
	base, work, probe string
}

func newWorld(t *testing.T, owner account) world {
	t.Helper()
	base, err := os.MkdirTemp("", "tasksecrets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	w := world{base: base, work: base + "/work", probe: base + "/probe"}
	if err := os.Mkdir(w.work, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(w.work, owner.UID, owner.GID); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(w.probe, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return w
}
