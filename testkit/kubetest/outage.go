package kubetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// API server outages, for fault tests. Two kinds differ in what a client
// sees:
//
//   - PauseAPIServer freezes the process (SIGSTOP): its port still accepts
//     connections (the kernel completes the handshake) but nothing answers,
//     so every request runs into its client's timeout. ResumeAPIServer
//     (SIGCONT) lets it carry on where it was, watches included.
//   - StopAPIServer kills the process: requests are refused at once
//     (connection refused). StartAPIServer runs it again on the same port,
//     with the same certificates and the same etcd, and waits until it is
//     ready; the cluster's state is what etcd kept.
//
// KWOK and the controller manager stay up through either and reconnect on
// their own, as they would to a real control plane coming back.

const apiServerName = "kube-apiserver"

// PauseAPIServer stops the API server's process with SIGSTOP and returns
// once every one of its threads is stopped. The signal is delivered to the
// threads one by one: a thread running on another core when kill returns
// could otherwise still answer a request sent at once.
func (c *Cluster) PauseAPIServer() error {
	if err := c.signalAPIServer(syscall.SIGSTOP, "pause"); err != nil {
		return err
	}
	c.mu.Lock()
	p, err := c.apiServer()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return waitStopped(p.cmd.Process.Pid, 10*time.Second)
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/<pid>/task/<tid>/stat), for at most limit.
func waitStopped(pid int, limit time.Duration) error {
	tasks := filepath.Join("/proc", strconv.Itoa(pid), "task")
	for deadline := time.Now().Add(limit); ; {
		running, err := runningThreads(tasks)
		if err != nil {
			return fmt.Errorf("kubetest: pause the API server: %w", err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubetest: pause the API server: %d threads still not stopped after %v", running, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads under tasks (a /proc/<pid>/task
// directory) that are not stopped.
func runningThreads(tasks string) (int, error) {
	ents, err := os.ReadDir(tasks)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(tasks, e.Name(), "stat"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited
		}
		if err != nil {
			return 0, err
		}
		// The state follows the command's closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return 0, fmt.Errorf("unreadable %s", filepath.Join(tasks, e.Name(), "stat"))
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			n++
		}
	}
	return n, nil
}

// ResumeAPIServer continues a paused API server with SIGCONT.
func (c *Cluster) ResumeAPIServer() error {
	return c.signalAPIServer(syscall.SIGCONT, "resume")
}

func (c *Cluster) signalAPIServer(sig syscall.Signal, what string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.apiServer()
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("kubetest: %s the API server: %w", what, err)
	}
	return nil
}

// StopAPIServer kills the API server (SIGKILL, a crash: no graceful
// drain of its watches) and waits until it has exited.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.apiServer()
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kubetest: stop the API server: %w", err)
	}
	<-p.exited
	return nil
}

// StartAPIServer starts a stopped API server again, as it was started
// first (same port, flags and etcd), and waits until it is ready or ctx
// ends. It does nothing to one that runs.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, err := c.apiServer()
	if err != nil {
		return err
	}
	select {
	case <-p.exited:
	default:
		return nil // it runs (perhaps paused: ResumeAPIServer continues it)
	}
	if err := c.start(p, p.cmd.Path, p.cmd.Args[1:], 0 /* append to its log */); err != nil {
		return err
	}
	client, token := c.httpClient(), c.tokens[Admin]
	return c.waitReady(ctx, p, func(ctx context.Context) error {
		_, err := get(ctx, client, c.host+"/readyz", token)
		return err
	})
}

// apiServer returns the API server's process; c.mu is held.
func (c *Cluster) apiServer() (*process, error) {
	return c.named(apiServerName)
}

// CompactEtcd compacts etcd's history up to its current revision, as the
// API server's own periodic compaction does (every five minutes by
// default), and returns that revision. A watch can then resume only from a
// revision at or after it: with the API server restarted after an outage
// (so that its watch cache starts over too), a client's informer cannot
// resume its watch and must list again, as after an outage longer than the
// compaction interval.
func (c *Cluster) CompactEtcd(ctx context.Context) (int64, error) {
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// Any key answers with the header: the current revision.
	if err := etcdCall(ctx, c.etcd+"/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/"))}, &rng); err != nil {
		return 0, fmt.Errorf("kubetest: read etcd's revision: %w", err)
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kubetest: read etcd's revision: %q: %w", rng.Header.Revision, err)
	}
	if err := etcdCall(ctx, c.etcd+"/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil); err != nil {
		return 0, fmt.Errorf("kubetest: compact etcd at revision %d: %w", rev, err)
	}
	return rev, nil
}

// etcdCall posts req to one of etcd's JSON gateway endpoints and decodes
// its answer into out (nil: discarded).
func etcdCall(ctx context.Context, url string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
