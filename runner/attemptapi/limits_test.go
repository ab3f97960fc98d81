package attemptapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/runner/attemptapi"
)

// serveBounded serves a trivial handler through the attempt API's listener
// (TLS, the connection cap) and server (its timeouts).
func serveBounded(t *testing.T, limits httplimit.Limits) *attemptapi.Listener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := attemptapi.Listen(ctx, attemptapi.ListenConfig{Listen: "127.0.0.1:0",
		StateDir: filepath.Join(t.TempDir(), "state"), Limits: limits})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := attemptapi.Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), hclog.NewNullLogger())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln
}

func tlsDial(t *testing.T, ln *attemptapi.Listener) *tls.Conn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(ln.CA))
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readUntilClosed reads until the server closes c; the bound is only a
// backstop, far past the server's configured timeout.
func readUntilClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the attempt API kept the connection open (read %q)", b)
	}
	return string(b)
}

// TestAttemptAPIServerBounds: a client that opens a connection and never
// completes its TLS handshake, or completes it and never finishes its
// headers (slowloris), is cut off at read_header_timeout; past
// max_connections the next connection waits (counted before TLS, so
// handshakes in progress hold slots too); a listener with invalid limits
// is refused. Timeouts are configured short; nothing waits for a threshold.
func TestAttemptAPIServerBounds(t *testing.T) {
	short := httplimit.Limits{ReadHeaderTimeout: 100 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: time.Second, IdleTimeout: 100 * time.Millisecond, MaxConns: 8}

	t.Run("HandshakeNeverStartedCutOff", func(t *testing.T) {
		ln := serveBounded(t, short)
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		readUntilClosed(t, c)
	})

	t.Run("SlowlorisCutOffAtReadHeaderTimeout", func(t *testing.T) {
		ln := serveBounded(t, short)
		c := tlsDial(t, ln)
		defer c.Close()
		if _, err := io.WriteString(c, "POST /v1/heartbeat HTTP/1.1\r\nHost: reaperd\r\nX-Slow: 1\r\n"); err != nil {
			t.Fatal(err)
		}
		if got := readUntilClosed(t, c); strings.Contains(got, "200 OK") {
			t.Fatalf("a request without the end of its headers was answered: %q", got)
		}
	})

	t.Run("ConnectionCapCountsHandshakesInProgress", func(t *testing.T) {
		capped := httplimit.Limits{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Minute,
			WriteTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: 1}
		ln := serveBounded(t, capped)
		// A raw connection that never says hello holds the one slot.
		holder, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM([]byte(ln.CA))
		raw, err := net.Dial("tcp", ln.Addr().String()) // queued by the kernel
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		next := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		_ = raw.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if err := next.Handshake(); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a second connection was served past max_connections = 1: %v", err)
		}
		// The handshake timed out on our side; a fresh connection gets the
		// slot once the holder (and the abandoned one) leave.
		raw.Close()
		holder.Close()
		c := tlsDial(t, ln)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: reaperd\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if got := readUntilClosed(t, c); !strings.Contains(got, "200 OK") {
			t.Fatalf("once the slot freed: %q", got)
		}
	})

	t.Run("InvalidLimitsRefused", func(t *testing.T) {
		bad := short
		bad.IdleTimeout = -time.Second
		_, err := attemptapi.Listen(context.Background(), attemptapi.ListenConfig{Listen: "127.0.0.1:0",
			StateDir: filepath.Join(t.TempDir(), "state"), Limits: bad})
		if err == nil || !strings.Contains(err.Error(), "idle_timeout") {
			t.Fatalf("idle_timeout -1s: %v", err)
		}
	})
}
