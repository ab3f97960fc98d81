package attemptapi

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/dexaflow/reaper/internal/httplimit"
	"github.com/dexaflow/reaper/internal/secretfile"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk/clock"
)

// ListenConfig is where and how the API listens.
type ListenConfig struct {
	// Listen is host:port. Port 0 picks a free port.
	Listen string
	// Advertise is the base URL agents are given; default https://<bound address>.
	Advertise string
	// CertFile and KeyFile are the operator's certificate and key (PEM).
	// Both empty: a self-signed certificate for the loopback addresses is
	// generated once into StateDir and reused, and Listen must be a
	// loopback address.
	CertFile, KeyFile string
	// CAFile is the PEM agents are told to trust; default: CertFile (the
	// generated certificate when none is given).
	CAFile string
	// StateDir holds the generated certificate (loopback-tls.pem).
	StateDir string
	// Limits bound the server's connections (timeouts, the cap); the
	// zero value: httplimit.DefaultAttemptAPI.
	Limits httplimit.Limits
	// MaxConnsPerAddress bounds the connections of one source address
	// (httplimit.TrackedListener); 0: httplimit's default.
	MaxConnsPerAddress int
	// Meter, when set, is told of every connection refused or closed to
	// make room.
	Meter ConnMeter
	// Logger logs those at a bounded rate; Clock times that rate and how
	// long a new connection may take before it can be closed to make room
	// (httplimit.NewGraceDefault). Defaults: none, clock.Real{}.
	Logger hclog.Logger
	Clock  clock.Clock
}

// Listener is the bound, TLS-wrapped listener and what an agent needs to
// reach it.
type Listener struct {
	net.Listener
	// URL is the base URL agents dial.
	URL string
	// CA is the PEM agents trust for URL.
	CA string

	limits  httplimit.Limits
	tracked *httplimit.TrackedListener
	// streamClosed meters and logs a heartbeat stream closed for its
	// framing (result: ConnStreamFrameSize, ConnStreamMalformed; n: the
	// length read).
	streamClosed func(result, remote string, n int64)
	// streamOpened meters a heartbeat stream negotiated.
	streamOpened func()
}

// loopbackCertFile is the generated certificate and key, one PEM file.
const loopbackCertFile = "loopback-tls.pem"

// Listen binds the API's address with SO_REUSEPORT, so that the replicas
// of one machine (Lite) can share one address: an agent whose replica
// stopped reaches another one on its next connection.
func Listen(ctx context.Context, cfg ListenConfig) (*Listener, error) {
	limits := cfg.Limits
	if limits == (httplimit.Limits{}) {
		limits = httplimit.DefaultAttemptAPI()
	}
	if err := limits.Validate(); err != nil {
		return nil, fmt.Errorf("attempt api: %w", err)
	}
	cert, ca, err := certificate(cfg)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("attempt api: listen on %s: %w", cfg.Listen, err)
	}
	url := cfg.Advertise
	if url == "" {
		url = "https://" + ln.Addr().String()
	}
	// The caps count raw connections, so a handshake in progress is
	// counted too.
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	tracked := httplimit.Track(ln, httplimit.TrackConfig{Max: limits.MaxConns,
		PerAddr: cmp.Or(cfg.MaxConnsPerAddress, httplimit.AttemptAPIConnsPerAddressDefault), Now: clk.Now, After: clk.After, Hooks: connHooks(cfg)})
	// ALPN: the heartbeat stream first (a client that asks for it gets
	// it), then HTTP/1.1; a client that asks for neither speaks HTTP/1.1.
	tl := tls.NewListener(tracked, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		NextProtos: []string{ProtoHeartbeatStream, "http/1.1"}})
	return &Listener{Listener: tl, URL: url, CA: ca, limits: limits, tracked: tracked,
		streamClosed: streamHook(cfg), streamOpened: func() {
			if cfg.Meter != nil {
				cfg.Meter.AttemptAPIConnection(ConnStreamOpened)
			}
		}}, nil
}

// streamHook meters, and logs at a bounded rate, a heartbeat stream the
// server closed for its framing.
func streamHook(cfg ListenConfig) func(result, remote string, n int64) {
	logger, clk := cfg.Logger, cfg.Clock
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if clk == nil {
		clk = clock.Real{}
	}
	log := newSparseLog(logger, clk)
	return func(result, remote string, n int64) {
		if cfg.Meter != nil {
			cfg.Meter.AttemptAPIConnection(result)
		}
		log.Warn(result, "attempt api: a heartbeat stream sent a malformed frame: closed", "remote", remote,
			"length", n, "limit", maxStreamFrame)
	}
}

// connHooks meter, and log at a bounded rate, what the listener does to
// a client's connections.
func connHooks(cfg ListenConfig) httplimit.TrackHooks {
	logger, clk := cfg.Logger, cfg.Clock
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if clk == nil {
		clk = clock.Real{}
	}
	log := newSparseLog(logger, clk)
	meter := func(result string) {
		if cfg.Meter != nil {
			cfg.Meter.AttemptAPIConnection(result)
		}
	}
	return httplimit.TrackHooks{
		Refused: func(addr string) {
			meter(ConnRefusedAddressCap)
			log.Warn(ConnRefusedAddressCap, "attempt api: a source address is over its connections, each in a call or "+
				"just opened: a new one refused", "remote", addr)
		},
		Evicted: func(addr, reason string) {
			result := ConnEvictedServerCap
			if reason == "address_cap" {
				result = ConnEvictedAddressCap
			}
			meter(result)
			log.Warn(result, "attempt api: a connection waiting without a call was closed to make room", "remote", addr,
				"cap", reason)
		},
	}
}

// Open is how many connections the listener holds open now, and how many
// of them from the source address addr.
func (l *Listener) Open(addr string) (all, fromAddr int) { return l.tracked.Open(addr) }

// Serving is how many of the listener's connections are serving a call.
func (l *Listener) Serving() int { return l.tracked.Serving() }

// certificate loads the operator's certificate, or the generated loopback
// one, and the CA agents should trust.
func certificate(cfg ListenConfig) (tls.Certificate, string, error) {
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return tls.Certificate{}, "", errors.New("attempt api: tls_cert and tls_key go together")
	}
	if cfg.CertFile != "" {
		if err := secretfile.PrivateKey(cfg.KeyFile); err != nil {
			return tls.Certificate{}, "", fmt.Errorf("attempt api: %w", err)
		}
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return tls.Certificate{}, "", fmt.Errorf("attempt api: loading the certificate: %w", err)
		}
		caFile := cfg.CAFile
		if caFile == "" {
			caFile = cfg.CertFile
		}
		ca, err := os.ReadFile(caFile)
		if err != nil {
			return tls.Certificate{}, "", fmt.Errorf("attempt api: reading the CA agents trust: %w", err)
		}
		return cert, string(ca), nil
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("attempt api: listen %q: %w", cfg.Listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return tls.Certificate{}, "", fmt.Errorf("attempt api: listen %q is not a loopback address: "+
			"give tls_cert and tls_key (a generated certificate is for loopback Lite use only)", cfg.Listen)
	}
	if cfg.StateDir == "" {
		return tls.Certificate{}, "", errors.New("attempt api: no state directory for the generated certificate")
	}
	return loopbackCertificate(cfg.StateDir)
}

// loopbackCertificate loads the generated certificate from dir, making it
// first when there is none (the first replica's wins).
func loopbackCertificate(dir string) (tls.Certificate, string, error) {
	if err := keyfile.PrivateDir(dir); err != nil {
		return tls.Certificate{}, "", fmt.Errorf("attempt api: %w", err)
	}
	path := filepath.Join(dir, loopbackCertFile)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		pemBytes, err := generateLoopback(time.Now())
		if err != nil {
			return tls.Certificate{}, "", err
		}
		if err := keyfile.PublishFile(path, pemBytes); err != nil {
			return tls.Certificate{}, "", fmt.Errorf("attempt api: %w", err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("attempt api: reading the generated certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("attempt api: the generated certificate %s: %w", path, err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	return cert, string(ca), nil
}

// generateLoopback makes a self-signed certificate (its own CA) for
// 127.0.0.1, ::1 and localhost, valid five years, as certificate then key.
func generateLoopback(now time.Time) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("attempt api: generating a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, fmt.Errorf("attempt api: generating a serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "reaperd attempt api (loopback)"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(5, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("attempt api: creating the certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("attempt api: encoding the key: %w", err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...), nil
}

// Serve serves h on ln until ctx is done, then shuts down (calls in flight
// get 5 s), with the timeouts of ln's limits. The returned channel
// receives the server's error once.
func Serve(ctx context.Context, ln *Listener, h http.Handler, log hclog.Logger) <-chan error {
	limits := ln.limits
	if limits == (httplimit.Limits{}) {
		limits = httplimit.DefaultAttemptAPI()
	}
	srv := limits.Server(h)
	if ln.tracked != nil {
		srv.ConnState = ln.tracked.ConnState
	}
	srv.ConnContext = withConnTokens
	// The heartbeat stream (stream.go), on the connections that negotiate
	// it; Shutdown does not close those, the set does.
	streams := newStreamSet()
	srv.RegisterOnShutdown(streams.shutdown)
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){
		ProtoHeartbeatStream: func(_ *http.Server, c *tls.Conn, _ http.Handler) {
			if s, ok := h.(*Server); ok {
				s.serveStream(ctx, ln, c, streams)
			}
			// Any other handler (a test's) serves no stream: closed.
		},
	}
	// The server's own complaints (a handshake a scanner never finished,
	// a client cut off) are a flood's to make: debug level.
	srv.ErrorLog = log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("attempt api shutdown", "error", err)
		}
	}()
	go func() {
		log.Info("attempt api serving", "listen", ln.Addr().String(), "url", ln.URL)
		err := srv.Serve(ln)
		<-stopped
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	return done
}
