// Command netprobe is what a pod of the in-cluster test runs to check the
// cluster's networking with Go's own resolver and dialer (those reaperd and
// its agents use): each argument is one check, run in order, and the first
// that fails ends it with status 1.
//
//	resolve:NAME=IP    NAME resolves (through the pod's resolv.conf) to IP
//	get:URL=TEXT       an HTTP GET of URL answers 200 with TEXT in its body
//	dial:HOST:PORT     a TCP connection to HOST:PORT opens
//	nodial:HOST:PORT   a TCP connection to HOST:PORT is refused or times
//	                   out (a NetworkPolicy's refusal)
//	blocked:HOST:PORT  as nodial, waiting up to 15 seconds for the refusal:
//	                   an enforcer applies a new pod's egress rules a moment
//	                   after the pod starts, so the first check of an
//	                   egress policy waits for them, and the nodial checks
//	                   after it run once
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	for _, arg := range os.Args[1:] {
		if err := retry(arg); err != nil {
			fmt.Fprintf(os.Stderr, "netprobe: %s: %v\n", arg, err)
			os.Exit(1)
		}
		fmt.Printf("netprobe: %s: ok\n", arg)
	}
}

// retry runs a check that must succeed again every quarter second for up
// to 15 seconds: a pod's first packets can come before the NetworkPolicy
// enforcer has learnt its address. A check that must fail runs once.
func retry(arg string) error {
	if strings.HasPrefix(arg, "nodial:") {
		return check(arg)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := check(arg)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func check(arg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kind, rest, _ := strings.Cut(arg, ":")
	switch kind {
	case "resolve":
		name, want, _ := strings.Cut(rest, "=")
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		if err != nil {
			return err
		}
		if !slices.Contains(addrs, want) {
			return fmt.Errorf("resolved to %v, want %s", addrs, want)
		}
	case "get":
		i := strings.LastIndex(rest, "=")
		if i < 0 {
			return fmt.Errorf("want get:URL=TEXT")
		}
		url, want := rest[:i], rest[i+1:]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			return fmt.Errorf("%s: %q, want %q", resp.Status, body, want)
		}
	case "dial":
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", rest)
		if err != nil {
			return err
		}
		return conn.Close()
	case "nodial", "blocked":
		d := net.Dialer{Timeout: 3 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", rest)
		if err == nil {
			conn.Close()
			return fmt.Errorf("connected")
		}
	default:
		return fmt.Errorf("unknown check %q", kind)
	}
	return nil
}
