package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
)

// socketDirPrefix begins the name of a host's socket directory,
// reaperd-<host pid>, under the temporary directory.
//
// Left to itself go-plugin makes every Unix socket of a plugin connection
// (the plugin's own listener and the host's broker listeners) straight in
// the temporary directory, and only a clean close removes one: a plugin
// killed (a crash, kill -9, the OOM killer) or a host killed would leave
// its sockets behind for good. So the host starts its plugins through a
// runner of its own, which makes go-plugin keep each plugin's sockets in a
// directory of their own inside the host's socket directory and remove it
// whenever the plugin is killed or reaped, however it ended; the host's
// directory goes when its last plugin does; and the directories of hosts
// that no longer run are removed the first time a Loader launches.
//
// Names are short on purpose: a Unix socket's whole path must fit in about
// 100 bytes.
const socketDirPrefix = "reaperd-"

// socketHome is a host's socket directory, shared by its plugins.
type socketHome struct {
	mu    sync.Mutex
	swept bool
	live  int
}

// acquire makes sure the host's directory exists (sweeping dead hosts'
// the first time) and counts one more plugin using it.
func (h *socketHome) acquire(log hclog.Logger) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	base := os.TempDir()
	if !h.swept {
		h.swept = true
		for _, dir := range sweepSocketDirs(base) {
			log.Info("removed the plugin socket directory of a host that no longer runs", "dir", dir)
		}
	}
	dir := filepath.Join(base, socketDirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("make the plugin socket directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("check the plugin socket directory: %w", err)
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("plugin socket directory %s: not a private directory (%s)", dir, st.Mode())
	}
	h.live++
	return dir, nil
}

// release counts one plugin less, removing the directory after the last.
func (h *socketHome) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live--
	if h.live == 0 {
		_ = os.Remove(filepath.Join(os.TempDir(), socketDirPrefix+strconv.Itoa(os.Getpid())))
	}
}

// sweepSocketDirs removes, under base, the socket directories of hosts
// whose process no longer exists. A directory whose pid now names another
// process is kept: that only delays its removal.
func sweepSocketDirs(base string) []string {
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var removed []string
	for _, ent := range ents {
		name := ent.Name()
		if !ent.IsDir() || !strings.HasPrefix(name, socketDirPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(name, socketDirPrefix))
		if err != nil || pid <= 0 || pid == os.Getpid() || processExists(pid) {
			continue
		}
		if os.RemoveAll(filepath.Join(base, name)) == nil {
			removed = append(removed, name)
		}
	}
	return removed
}

// processExists probes pid with signal 0; anything but "no such process"
// counts as existing.
func processExists(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, syscall.ESRCH)
}

// cmdRunner runs a plugin binary as a child process: what go-plugin does
// by default, given to it as a RunnerFunc so that go-plugin manages a
// socket directory for the plugin.
type cmdRunner struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser
	pid            int
}

var _ runner.Runner = (*cmdRunner)(nil)

// runnerFunc starts the binary at path with the environment go-plugin
// prepared (the host's, its handshake, the socket directory) plus extra.
// The runner it makes is stored in *made.
func runnerFunc(path string, extra []string, made **cmdRunner) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		cmd := exec.Command(path)
		cmd.Env = append(append([]string(nil), spec.Env...), extra...)
		cmd.Stdin = spec.Stdin
		dieWithHost(cmd)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, fmt.Errorf("plugin stdout: %w", err)
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, fmt.Errorf("plugin stderr: %w", err)
		}
		*made = &cmdRunner{cmd: cmd, stdout: stdout, stderr: stderr}
		return *made, nil
	}
}

func (r *cmdRunner) Start(context.Context) error {
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.pid = r.cmd.Process.Pid
	return nil
}

func (r *cmdRunner) Wait(context.Context) error { return r.cmd.Wait() }

func (r *cmdRunner) Kill(context.Context) error {
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *cmdRunner) Stdout() io.ReadCloser           { return r.stdout }
func (r *cmdRunner) Stderr() io.ReadCloser           { return r.stderr }
func (r *cmdRunner) Name() string                    { return r.cmd.Path }
func (r *cmdRunner) Diagnose(context.Context) string { return "" }

func (r *cmdRunner) ID() string {
	if r.pid == 0 {
		return ""
	}
	return strconv.Itoa(r.pid)
}

func (r *cmdRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (r *cmdRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// checksumRefusal checks the binary against the configured checksum (the
// host's job once a runner starts the plugin).
func checksumRefusal(secure *goplugin.SecureConfig, path string) error {
	if secure == nil {
		return nil
	}
	ok, err := secure.Check(path)
	if err != nil {
		return fmt.Errorf("verify checksum: %w", err)
	}
	if !ok {
		return classify(goplugin.ErrChecksumsDoNotMatch)
	}
	return nil
}
