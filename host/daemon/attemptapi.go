package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// keyReloadInterval is how often the signing key file is checked for a
// rotation.
const keyReloadInterval = 30 * time.Second

// apiPoolConns bounds the attempt API's connections to the board: each
// heartbeat is one short statement.
const apiPoolConns = 4

// generatedKeyFile is the signing key file reaperd generates in the
// attempt API's state directory when the operator names none.
const generatedKeyFile = "signing-keys.hcl"

// attemptAPI is this replica's attempt API: its listener, its server, and
// the keyring in force (swapped when the key file changes).
type attemptAPI struct {
	pool    *pgxpool.Pool // the API's own: agents' calls never queue behind the elector or the cycle
	ln      *attemptapi.Listener
	srv     *attemptapi.Server
	keys    atomic.Pointer[attempttoken.Keyring]
	keyFile string
	clk     clock.Clock
	log     hclog.Logger

	closeOnce sync.Once
}

// newAttemptAPI loads (or generates) the signing keys and the certificate
// and binds the listener. Every replica serves it, leading or not.
func newAttemptAPI(ctx context.Context, cfg *config.Config, m *metrics.Metrics,
	decisions func(context.Context, []sdk.Decision), clk clock.Clock, log hclog.Logger) (api *attemptAPI, err error) {
	c := cfg.AttemptAPI
	api = &attemptAPI{keyFile: c.SigningKeyFile, clk: clk, log: log}
	defer func() {
		if err != nil {
			api.close()
		}
	}()
	poolCfg, err := pgxpool.ParseConfig(cfg.StoreDSN)
	if err != nil {
		return nil, fmt.Errorf("attempt api: parse store dsn: %w", err)
	}
	poolCfg.MaxConns = apiPoolConns
	if api.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return nil, fmt.Errorf("attempt api: open store: %w", err)
	}
	var kr *attempttoken.Keyring
	if api.keyFile != "" {
		kr, err = keyfile.Load(api.keyFile)
	} else {
		api.keyFile = filepath.Join(c.StateDir, generatedKeyFile)
		kr, err = keyfile.LoadOrCreate(api.keyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("attempt api: %w", err)
	}
	api.keys.Store(kr)
	api.srv, err = attemptapi.NewServer(attemptapi.ServerConfig{
		Keys: api.keys.Load, TTL: cfg.Ladder.AttemptTokenTTL, Ceiling: cfg.Ladder.CredentialCeiling,
		WorkerCeiling: cfg.WorkerCredentialCeiling,
		Board:         lifecycle.New(api.pool, lifecycle.Options{CredentialCeiling: cfg.Ladder.CredentialCeiling}),
		Meter:         m, Decisions: decisions, Clock: clk, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	api.ln, err = attemptapi.Listen(ctx, attemptapi.ListenConfig{
		Listen: c.Listen, Advertise: c.Advertise, CertFile: c.TLSCert, KeyFile: c.TLSKey, CAFile: c.TLSCA,
		StateDir: c.StateDir, Limits: c.Limits,
	})
	if err != nil {
		return nil, err
	}
	log.Info("attempt api ready", "url", api.ln.URL, "signing_key", kr.CurrentID(), "key_file", api.keyFile)
	return api, nil
}

// issuer is what the runner mints credentials with.
func (a *attemptAPI) issuer(ttl time.Duration) attempttoken.Issuer {
	return attempttoken.Issuer{Keys: a.keys.Load, TTL: ttl, API: a.ln.URL, CA: a.ln.CA}
}

// run serves until ctx is done and rereads the key file when it changes.
// The channel receives the server's error once it has stopped.
func (a *attemptAPI) run(ctx context.Context) <-chan error {
	served := attemptapi.Serve(ctx, a.ln, a.srv, a.log)
	done := make(chan error, 1)
	go func() {
		tk := a.clk.NewTicker(keyReloadInterval)
		defer tk.Stop()
		last := modTime(a.keyFile)
		for {
			select {
			case <-ctx.Done():
				done <- <-served
				return
			case <-tk.C():
			}
			if mt := modTime(a.keyFile); !mt.Equal(last) {
				last = mt
				a.reload()
			}
		}
	}()
	return done
}

// reload swaps in the key file's keys; a file that does not load leaves
// the keys in force.
func (a *attemptAPI) reload() {
	kr, err := keyfile.Load(a.keyFile)
	if err != nil {
		a.log.Error("the signing key file changed but does not load: keeping the keys in force", "error", err)
		return
	}
	a.keys.Store(kr)
	a.log.Info("signing keys reloaded", "current", kr.CurrentID(), "key_file", a.keyFile)
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

// close releases the listener (when run never served it) and the pool.
func (a *attemptAPI) close() {
	a.closeOnce.Do(func() {
		if a.ln != nil {
			if err := a.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				a.log.Warn("closing the attempt api listener", "error", err)
			}
		}
		if a.pool != nil {
			a.pool.Close()
		}
	})
}
