package loader_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/internal/confine"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/testkit/unpriv"
)

// hostModeEnv, set, makes this test binary a plugin host instead of running
// tests: it makes itself non-dumpable as reaperd does, launches the test
// plugins as the request says, has them probe files, and prints what they
// found (hostAnswer) on stdout. Its value is the hostRequest, as JSON.
const hostModeEnv = "LOADER_TEST_HOST"

// hostCanary is in the host's environment (REAPER_DSN): a plugin that read
// the host's environ would hold it.
const hostCanary = "canary-dsn-7c2e"

type hostRequest struct {
	PluginDir string
	Secrets   []string
	TokenDir  string // the API credentials
	// Probe are the files the plugins try; "ENVIRON" stands for the host's
	// own /proc/<pid>/environ.
	Probe []string
}

type hostAnswer struct {
	// Reaper and Substrate: what each file gave a reaper and the substrate
	// launched with the request's secrets hidden. Bare: what it gave a
	// reaper launched with nothing hidden (no Landlock at all).
	Reaper, Substrate, Bare map[string]string
	// Caps are the reaper's CapEff, CapPrm, CapAmb and CapInh, as its
	// /proc/<pid>/status shows them; HostCaps the host's CapEff.
	Caps     map[string]string
	HostCaps string
	Error    string
}

// childCaps reads the Cap* lines of the status of every child of this
// process.
func childCaps() map[string]string {
	out := map[string]string{}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		for _, pid := range strings.Fields(string(b)) {
			for k, v := range statusCaps("/proc/" + pid + "/status") {
				out[k] = v
			}
		}
	}
	return out
}

func statusCaps(path string) map[string]string {
	out := map[string]string{}
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(k, "Cap") && k != "CapBnd" {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// hostMain is the host mode's main.
func hostMain() int {
	var req hostRequest
	answer := func(a hostAnswer) int {
		b, _ := json.Marshal(a)
		fmt.Println(string(b))
		return 0
	}
	if err := json.Unmarshal([]byte(os.Getenv(hostModeEnv)), &req); err != nil {
		return answer(hostAnswer{Error: err.Error()})
	}
	if err := confine.Undumpable(); err != nil {
		return answer(hostAnswer{Error: err.Error()})
	}
	environ := fmt.Sprintf("/proc/%d/environ", os.Getpid())
	paths := strings.ReplaceAll(strings.Join(req.Probe, "\n"), "ENVIRON", environ)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := hostAnswer{HostCaps: statusCaps("/proc/self/status")["CapEff"]}
	probe := func(ld *loader.Loader, spec loader.Spec) (map[string]string, error) {
		p, err := ld.Launch(ctx, spec)
		if err != nil {
			return nil, err
		}
		defer p.Kill()
		if spec.Kind == sdk.KindReaper && a.Caps == nil {
			a.Caps = childCaps()
		}
		values := sdk.Values{"probe": paths}
		if spec.Kind == sdk.KindReaper {
			values["mode"] = "probe"
		}
		if err := p.Base().Configure(ctx, sdk.ConfigureRequest{Edition: ladder.EditionLite, Values: values, Ladder: ladder.Defaults()}); err != nil {
			return nil, err
		}
		var state []byte
		if spec.Kind == sdk.KindReaper {
			res, err := p.Reaper().Reap(ctx, sdk.Pass{Now: time.Now(), Term: 1}, &recordingBoard{}, scriptedExec{}, nopSink{})
			if err != nil {
				return nil, err
			}
			state = res.State
		} else {
			res, err := p.Substrate().StopOrphan(ctx, sdk.StopRequest{Reason: sdk.StopOrphan})
			if err != nil {
				return nil, err
			}
			state = []byte(res.Detail)
		}
		got := map[string]string{}
		if err := json.Unmarshal(state, &got); err != nil {
			return nil, fmt.Errorf("probe answer %q: %w", state, err)
		}
		// Named as the request named them.
		if v, ok := got[environ]; ok {
			delete(got, environ)
			got["ENVIRON"] = v
		}
		return got, nil
	}
	var err error
	hidden := &loader.Loader{Dir: req.PluginDir, Logger: hclog.NewNullLogger(), Secrets: req.Secrets, APICredentials: []string{req.TokenDir}}
	if a.Reaper, err = probe(hidden, loader.Spec{Kind: sdk.KindReaper, Name: "echo"}); err != nil {
		return answer(hostAnswer{Error: "reaper: " + err.Error()})
	}
	if a.Substrate, err = probe(hidden, loader.Spec{Kind: sdk.KindSubstrate, Name: "reconcile"}); err != nil {
		return answer(hostAnswer{Error: "substrate: " + err.Error()})
	}
	bare := &loader.Loader{Dir: req.PluginDir, Logger: hclog.NewNullLogger()}
	if a.Bare, err = probe(bare, loader.Spec{Kind: sdk.KindReaper, Name: "echo"}); err != nil {
		return answer(hostAnswer{Error: "bare reaper: " + err.Error()})
	}
	return answer(a)
}

// TestPluginCannotOpenReaperdsSecrets: a plugin runs as reaperd's user, so
// file modes cannot keep reaperd's secrets from it. A real host process (this
// binary in host mode), run as an unprivileged user and made non-dumpable as
// reaperd makes itself, launches the real test plugins over go-plugin with
// its secrets named: a reaper is refused the host's /proc/<pid>/environ, the
// key files, the DSN file and the ServiceAccount token (a directory standing
// in for it), while it reads an ordinary file of the same owner and mode
// beside the keys; the substrate keeps the token and nothing else. Launched
// with nothing hidden, a plugin is still refused the host's environ (the
// host is non-dumpable) while it reads a dumpable process's of the same user.
// The host holds CAP_SETUID and CAP_SETGID as ambient capabilities, as
// reaperd does for Lite's run_as: the plugin holds no capability.
func TestPluginCannotOpenReaperdsSecrets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the host and its plugins as an unprivileged user, as reaperd runs where it is not root")
	}
	if _, err := confine.LandlockABI(); err != nil {
		t.Skipf("the kernel offers no Landlock: %v", err)
	}
	acct := unpriv.Find(t)
	base, err := os.MkdirTemp("", "loader-secrets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	plugins := filepath.Join(base, "plugins")
	if err := os.Mkdir(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(base, "host")
	unpriv.CopyFile(t, self, host, 0o755)
	for _, name := range []string{"reaper-echo", "reaper-substrate-reconcile"} {
		unpriv.CopyFile(t, filepath.Join(pluginDir, name), filepath.Join(plugins, name), 0o755)
	}
	work := filepath.Join(base, "work")
	own := func(path string, mode os.FileMode, dir bool) string {
		var err error
		if dir {
			err = os.Mkdir(path, mode)
		} else {
			err = os.WriteFile(path, []byte("secret "+hostCanary+"\n"), mode)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, acct.UID, acct.GID); err != nil {
			t.Fatal(err)
		}
		return path
	}
	own(work, 0o700, true)
	keys := own(filepath.Join(work, "keys"), 0o700, true)
	signing := own(filepath.Join(keys, "signing.key"), 0o600, false)
	tlsKey := own(filepath.Join(keys, "tls.key"), 0o600, false)
	ordinary := own(filepath.Join(keys, "ordinary"), 0o600, false)
	dsnFile := own(filepath.Join(work, "dsn"), 0o600, false)
	tokenDir := own(filepath.Join(work, "serviceaccount"), 0o755, true)
	token := own(filepath.Join(tokenDir, "token"), 0o600, false)

	control := exec.Command("sleep", "300")
	control.Env = []string{"CONTROL_SECRET=" + hostCanary}
	control.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
	if err := control.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = control.Process.Kill()
		_ = control.Wait()
	})
	controlEnviron := fmt.Sprintf("/proc/%d/environ", control.Process.Pid)

	req, _ := json.Marshal(hostRequest{PluginDir: plugins, Secrets: []string{signing, tlsKey, dsnFile}, TokenDir: tokenDir,
		Probe: []string{"ENVIRON", signing, tlsKey, dsnFile, token, ordinary, controlEnviron}})
	cmd := exec.Command(host)
	cmd.Env = []string{hostModeEnv + "=" + string(req), "REAPER_DSN=postgres://reaper:" + hostCanary + "@db/reaper",
		"PATH=" + os.Getenv("PATH")}
	// The host holds what reaperd holds for Lite's run_as: none of it may
	// reach a plugin.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential(), AmbientCaps: []uintptr{unix.CAP_SETUID, unix.CAP_SETGID}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the host: %v\n%s\n%s", err, out, stderr.String())
	}
	var a hostAnswer
	if err := json.Unmarshal(bytes.TrimSpace(out), &a); err != nil || a.Error != "" {
		t.Fatalf("the host's answer %q: %v %s\n%s", out, err, a.Error, stderr.String())
	}
	t.Logf("as uid %d (CapEff %s): reaper %v (caps %v); substrate %v; with nothing hidden %v", acct.UID, a.HostCaps,
		a.Reaper, a.Caps, a.Substrate, a.Bare)
	refused := func(s string) bool { return s == "EACCES" || s == "EPERM" || s == "ENOENT" }
	t.Run("ReaperRefusedTheHostsEnvironKeysDSNAndToken_ReadsAnOrdinaryFile", func(t *testing.T) {
		for name, p := range map[string]string{"the host's environ": "ENVIRON", "the signing key": signing,
			"the TLS key": tlsKey, "the DSN file": dsnFile, "the token": token} {
			if !refused(a.Reaper[p]) {
				t.Errorf("%s (%s): %q, want EACCES", name, p, a.Reaper[p])
			}
		}
		if a.Reaper[ordinary] != "read" {
			t.Errorf("an ordinary file beside the keys, same owner and mode: %q, want read", a.Reaper[ordinary])
		}
	})
	t.Run("SubstrateKeepsTheTokenNotTheKeysOrDSN", func(t *testing.T) {
		if a.Substrate[token] != "read" {
			t.Errorf("the token: %q, want read (the substrate talks to the API server with it)", a.Substrate[token])
		}
		for _, p := range []string{"ENVIRON", signing, tlsKey, dsnFile} {
			if !refused(a.Substrate[p]) {
				t.Errorf("%s: %q, want EACCES", p, a.Substrate[p])
			}
		}
	})
	t.Run("PluginHoldsNoneOfTheHostsCapabilities", func(t *testing.T) {
		if a.HostCaps != "00000000000000c0" {
			t.Errorf("the host's CapEff %q, want CAP_SETUID and CAP_SETGID (else this proves nothing)", a.HostCaps)
		}
		for _, k := range []string{"CapEff", "CapPrm", "CapAmb", "CapInh"} {
			if a.Caps[k] != "0000000000000000" {
				t.Errorf("the plugin's %s = %q, want 0", k, a.Caps[k])
			}
		}
	})
	t.Run("NonDumpableHostsEnvironRefusedEvenWithNothingHidden", func(t *testing.T) {
		if !refused(a.Bare["ENVIRON"]) {
			t.Errorf("the host's environ: %q, want EACCES", a.Bare["ENVIRON"])
		}
		if a.Bare[controlEnviron] != "read" {
			t.Errorf("a dumpable process of the same user: %q, want read (else the refusal proves nothing)", a.Bare[controlEnviron])
		}
		if a.Bare[signing] != "read" {
			t.Errorf("the signing key with nothing hidden: %q, want read (else the hiding proves nothing)", a.Bare[signing])
		}
	})
}
