package soak

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fenceMetric counts the fenced writes (batches) a replica's board refused
// as deposed.
const fenceMetric = "reaper_fence_refused_total"

// telemetryLine finds the address a replica's telemetry listens on in its
// log (text or JSON lines).
var telemetryLine = regexp.MustCompile(`telemetry listening.*?addr"?[=:]\s*"?([0-9.]+:[0-9]+)`)

// fenceCounts reads, from each running replica's telemetry, how many
// writes its fence refused so far, keeping the largest count each process
// showed (keyed by slot and pid: a restarted replica counts from zero).
// Counts a process reached after its last read (a kill -9 between reads)
// are missed: the soak's figure is a lower bound.
func (s *soak) fenceCounts(ctx context.Context) {
	for _, d := range s.daemons {
		pid := d.pid()
		if pid == 0 {
			continue
		}
		addr := lastTelemetryAddr(filepath.Join(s.logDir, fmt.Sprintf("reaperd-%d.log", d.slot)))
		if addr == "" {
			continue
		}
		n, err := scrapeFence(ctx, addr)
		if err != nil {
			continue // restarting, paused, or its log not written yet
		}
		key := fmt.Sprintf("%d/%d", d.slot, pid)
		at := s.tl.now()
		s.mu.Lock()
		if s.fenceRefused == nil {
			s.fenceRefused, s.fenceSeen = map[string]float64{}, map[string]time.Time{}
		}
		if n > s.fenceRefused[key] {
			// Made since this process's last scrape (its start, if none).
			since, ok := s.fenceSeen[key]
			if !ok {
				since = s.tl.wall
			}
			s.fenceRises = append(s.fenceRises, fenceRise{Since: since, At: at, Refused: n - s.fenceRefused[key]})
		}
		s.fenceRefused[key] = max(s.fenceRefused[key], n)
		s.fenceSeen[key] = at
		s.mu.Unlock()
	}
}

// fenceTotal is the sum of the counts fenceCounts read.
func (s *soak) fenceTotal() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n float64
	for _, v := range s.fenceRefused {
		n += v
	}
	return int(n)
}

func lastTelemetryAddr(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	addr := ""
	for sc.Scan() {
		if m := telemetryLine.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	return addr
}

// scrapeFence sums fenceMetric over its labels on one replica's /metrics.
func scrapeFence(ctx context.Context, addr string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var n float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, fenceMetric+"{") && !strings.HasPrefix(line, fenceMetric+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += v
		}
	}
	return n, sc.Err()
}

// The soak finds each replica's telemetry in its log, text or JSON, and
// sums the fence's refusals over their labels.
func TestFenceScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "# HELP "+fenceMetric+" x\n# TYPE "+fenceMetric+" counter\n"+
			fenceMetric+"{write=\"mark\"} 3\n"+fenceMetric+"{write=\"runner write\"} 2\nreaper_other_total 9\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	text := filepath.Join(dir, "text.log")
	js := filepath.Join(dir, "json.log")
	if err := os.WriteFile(text, []byte("2026-12-07T09:00:00Z [INFO]  reaperd.telemetry: telemetry listening: addr=127.0.0.1:1\n"+
		"2026-12-07T09:00:05Z [INFO]  reaperd.telemetry: telemetry listening: addr="+addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(js, []byte(`{"@level":"info","@message":"telemetry listening","@module":"reaperd.telemetry","addr":"`+
		addr+`"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{text, js} {
		if got := lastTelemetryAddr(path); got != addr {
			t.Errorf("%s: address %q, want the last one logged, %q", filepath.Base(path), got, addr)
		}
	}
	n, err := scrapeFence(context.Background(), addr)
	if err != nil || n != 5 {
		t.Errorf("refusals %v (%v), want 5", n, err)
	}
}
