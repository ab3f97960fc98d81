package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// front is the attempt API's one address for the kube demo's pods, as a
// Service would be: it passes each connection, unopened (TLS end to end),
// to the first replica that accepts it, so that agents keep reporting
// when the leading replica is killed.
type front struct {
	ln       net.Listener
	mu       sync.Mutex
	backends []string // host:port, in order of preference
	wg       sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
}

// startFront starts the front on a free port of ip: loopback for the
// player, the pod network's gateway for the real node.
func startFront(ip string) (*front, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("the attempt API's front: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &front{ln: ln, ctx: ctx, cancel: cancel}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); f.pass(c) }()
		}
	}()
	return f, nil
}

// url is the front's https URL (the replicas' certificate covers its
// address whatever the port: the generated one 127.0.0.1, the real node's
// the gateway).
func (f *front) url() string { return "https://" + f.ln.Addr().String() }

// add puts a replica's attempt API behind the front.
func (f *front) add(apiURL string) {
	u, err := url.Parse(apiURL)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backends = append(f.backends, u.Host)
}

// pass copies c to the first backend that accepts a connection, both ways,
// until either side closes or the front does.
func (f *front) pass(c net.Conn) {
	f.mu.Lock()
	backends := append([]string(nil), f.backends...)
	f.mu.Unlock()
	var b net.Conn
	for _, addr := range backends {
		var err error
		if b, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
	}
	if b == nil {
		_ = c.Close()
		return
	}
	var copies sync.WaitGroup
	done := make(chan struct{}, 2)
	for _, pair := range [][2]net.Conn{{b, c}, {c, b}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			_, _ = io.Copy(pair[0], pair[1])
			done <- struct{}{}
		}()
	}
	select {
	case <-done:
	case <-f.ctx.Done():
	}
	_ = c.Close()
	_ = b.Close()
	copies.Wait()
}

// close stops accepting, ends every connection and waits for them.
func (f *front) close() {
	f.cancel()
	_ = f.ln.Close()
	f.wg.Wait()
}
