package loader

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/hashicorp/go-plugin/runner"
)

// process runs a plugin binary as a child process for go-plugin. It does
// what go-plugin's own command runner does; the host supplies it (through
// ClientConfig.RunnerFunc) because that is the one way go-plugin puts both
// ends' unix sockets in a directory of the host's choosing, which it
// removes when the plugin is killed.
type process struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser
	before         func()
	path           string
}

var _ runner.Runner = (*process)(nil)

// newProcess prepares the open binary bin (found at path) to run with the
// environment go-plugin made for it (the handshake, the client
// certificate, the socket directory: the host's own environment is not in
// it) plus extra. The child executes bin itself, not path, confined so that
// it holds no capability and can open none of the hidden paths (execFile).
func newProcess(path string, bin *os.File, spec *exec.Cmd, extra, hidden []string, before func(string)) (*process, error) {
	cmd := execFile(path, bin, hidden)
	cmd.Env = append(append([]string(nil), spec.Env...), extra...)
	cmd.Stdin = spec.Stdin
	dieWithHost(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, stdout: stdout, stderr: stderr, path: path}
	if before != nil {
		p.before = func() { before(path) }
	}
	return p, nil
}

func (p *process) Start(context.Context) error {
	if p.before != nil {
		p.before()
	}
	return p.cmd.Start()
}

func (p *process) Wait(context.Context) error { return p.cmd.Wait() }

func (p *process) Kill(context.Context) error {
	if p.cmd.Process == nil {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (p *process) Stdout() io.ReadCloser { return p.stdout }

func (p *process) Stderr() io.ReadCloser { return p.stderr }

func (p *process) Name() string { return p.path }

func (p *process) ID() string {
	if p.cmd.Process == nil {
		return ""
	}
	return strconv.Itoa(p.cmd.Process.Pid)
}

func (p *process) Diagnose(context.Context) string {
	return "(is " + p.path + " a plugin built for this machine with this SDK?)"
}

func (p *process) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (p *process) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}
