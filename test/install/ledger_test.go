package install_test

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/kubetest"
)

// ledger is an HTTP server on the pod network's gateway that the tasks,
// in their containers, report each execution's start and end to, and ask
// whether they may end (release). It counts an execution that started
// while another of its task was open: a double execution.
type ledger struct {
	url string
	mu  sync.Mutex
	// open counts, per task, the executions started and not ended.
	open map[string]int
	// starts lists, per task, each execution's "try.epoch".
	starts   map[string][]string
	doubles  []string
	released map[string]bool // run -> its tasks may end
}

func startLedger(t *testing.T) *ledger {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(kubetest.NodeGateway, "0"))
	if err != nil {
		t.Fatalf("ledger: listen on the gateway: %v", err)
	}
	lg := &ledger{url: "http://" + l.Addr().String(), open: map[string]int{}, starts: map[string][]string{},
		released: map[string]bool{}}
	srv := &http.Server{Handler: http.HandlerFunc(lg.serve), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return lg
}

func (lg *ledger) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := q.Get("run") + "/" + q.Get("task")
	lg.mu.Lock()
	defer lg.mu.Unlock()
	switch r.URL.Path {
	case "/released":
		if !lg.released[q.Get("run")] {
			http.Error(w, "not yet", http.StatusNotFound)
		}
	case "/start":
		if lg.open[key] > 0 {
			lg.doubles = append(lg.doubles, fmt.Sprintf("%s try %s epoch %s", key, q.Get("try"), q.Get("epoch")))
		}
		lg.open[key]++
		lg.starts[key] = append(lg.starts[key], q.Get("try")+"."+q.Get("epoch"))
	case "/end":
		lg.open[key]--
	default:
		http.NotFound(w, r)
	}
}

// command is a task's shell command: report the start, wait for the
// run's release, report the end.
func (lg *ledger) command(run, task string) string {
	get := func(path string) string {
		return "wget -q -O /dev/null '" + lg.url + path + "?run=" + run + "&task=" + task + "&try='$REAPER_TRY'&epoch='$REAPER_EPOCH"
	}
	return get("/start") + "; until " + get("/released") + " 2>/dev/null; do sleep 0.3; done; " + get("/end")
}

// release lets the tasks of run end.
func (lg *ledger) release(run string) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.released[run] = true
}

// started counts the tasks of run with an execution started.
func (lg *ledger) started(run string, tasks []string) int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	n := 0
	for _, task := range tasks {
		if len(lg.starts[run+"/"+task]) > 0 {
			n++
		}
	}
	return n
}

// executions lists task's executions ("try.epoch" each).
func (lg *ledger) executions(run, task string) []string {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return append([]string(nil), lg.starts[run+"/"+task]...)
}

// forget drops task's open execution whose container is known gone (its
// end can never be reported): the next one is not a double of it.
func (lg *ledger) forget(run, task string) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.open[run+"/"+task] = 0
}

// doubleExecutions lists the executions that overlapped another of their
// task.
func (lg *ledger) doubleExecutions() []string {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return append([]string(nil), lg.doubles...)
}
