// Package netfault puts a network fault between a client and a server on
// loopback: a TCP proxy whose Cut makes every connection through it hang,
// as a partition that drops packets does (nothing is refused or reset, no
// byte passes either way, new connections are accepted and left waiting),
// and whose Heal lets the bytes held meanwhile through, as TCP's
// retransmissions would once the path is back.
//
// Point one client at the proxy instead of the server (its address in a
// DSN or a kubeconfig: the server's certificate names the loopback address,
// not the port) and the others at the server itself: Cut partitions that
// client alone.
package netfault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy forwards the connections made to Addr to the target.
type Proxy struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	healed chan struct{} // closed by Heal; a new one at each Cut
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts a proxy on a free loopback port, forwarding to target
// (host:port).
func Listen(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	p := &Proxy{l: l, target: target, healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.healed)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Cut partitions the path: from now no byte is forwarded either way and a
// connection made meanwhile is not forwarded until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		p.cut = true
		p.healed = make(chan struct{})
	}
}

// Heal ends the partition: what was held is forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.healed)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.l.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	if p.cut {
		p.cut = false
		close(p.healed)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// wait blocks while the path is cut, until Heal or Close.
func (p *Proxy) wait() {
	p.mu.Lock()
	h := p.healed
	p.mu.Unlock()
	<-h
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	p.wait() // a connection made while cut waits, accepted, for the heal
	var d net.Dialer
	s, err := d.DialContext(context.Background(), "tcp", p.target)
	if err != nil || !p.track(s) {
		_ = c.Close()
		return
	}
	var once sync.WaitGroup
	once.Add(2)
	go func() { defer once.Done(); p.pipe(s, c) }()
	go func() { defer once.Done(); p.pipe(c, s) }()
	once.Wait()
}

// pipe copies from src to dst, holding every chunk read while the path is
// cut until it heals, and closes both ends when either does.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}
