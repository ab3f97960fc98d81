package daemon

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// A restarted container's reaperd has its predecessor's host name and
// process id (PID 1 in the same pod): its leader identity must differ all
// the same, or it would take the predecessor's Lease and term as its own.
func TestDefaultHolderIsOneProcesssOwn(t *testing.T) {
	host, _ := os.Hostname()
	prefix := fmt.Sprintf("%s/%d/", host, os.Getpid())
	a, b := defaultHolder(), defaultHolder()
	if !strings.HasPrefix(a, prefix) || !strings.HasPrefix(b, prefix) {
		t.Fatalf("holders %q %q, want them to start with %q", a, b, prefix)
	}
	if a == b {
		t.Fatalf("two processes with the same host and pid got one holder %q", a)
	}
}
