package netfault_test

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/netfault"
)

// echo serves one line back per line on loopback.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// A cut holds every byte, on a connection made before it and on one made
// during it (accepted, never refused); the heal lets them through.
func TestCutHangsAndHealDelivers(t *testing.T) {
	p, err := netfault.Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	var d net.Dialer
	old, err := d.DialContext(context.Background(), "tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	or := bufio.NewReader(old)
	if got, err := roundTrip(old, or, 5*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("before the cut: %q %v", got, err)
	}

	p.Cut()
	if got, err := roundTrip(old, or, 300*time.Millisecond); err == nil {
		t.Fatalf("an answer crossed the cut: %q", got)
	}
	during, err := d.DialContext(context.Background(), "tcp", p.Addr())
	if err != nil {
		t.Fatalf("a connection during the cut was refused: %v", err)
	}
	defer during.Close()
	dr := bufio.NewReader(during)
	if got, err := roundTrip(during, dr, 300*time.Millisecond); err == nil {
		t.Fatalf("an answer crossed the cut on a new connection: %q", got)
	}

	p.Heal()
	_ = old.SetDeadline(time.Now().Add(5 * time.Second))
	// The old connection's held ping is answered, then a new one.
	if got, err := or.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("the held ping after the heal: %q %v", got, err)
	}
	_ = during.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := dr.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("the new connection's held ping after the heal: %q %v", got, err)
	}
}
