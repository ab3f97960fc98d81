// Package pgtest runs throwaway PostgreSQL servers for tests: one real
// server per test binary, started from the machine's own PostgreSQL
// binaries in a temporary directory on a free loopback port, and a fresh
// database for each test, copied from a template that already holds the
// board's schema.
//
// A test package wires it in with
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// (or calls Run from a TestMain of its own), and each test asks for its own
// database with pgtest.NewDB(t), or for a connection string with
// pgtest.NewDSN(t) when it hands the database to another process. Start and
// Stop run a server without the testing package (the pgtest command uses
// them for demos).
//
// For failover tests, a server started with Options.Replication makes
// streaming-replication standbys of itself (Standby, synchronous or not),
// which Promote makes primaries; Desynchronize makes a synchronous one
// asynchronous, StopStreaming makes a standby fall behind on purpose, and
// FailoverDSN names a primary and its standbys in one
// connection string. Kill crashes a server and Freeze stalls one (its
// processes stopped, as by a hung disk) until Thaw.
//
// When the tests run as root the server runs as an unprivileged account
// (postgres if the machine has one, else nobody), since PostgreSQL refuses to
// run as root. The server is tuned for speed, not durability: fsync is off.
package pgtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Superuser is the name of the server's superuser.
const Superuser = "reaper"

// Options configure Start.
type Options struct {
	// BaseDir is where the server's temporary directory is made; default
	// os.TempDir() (or /tmp when that is not reachable by the account the
	// server runs as).
	BaseDir string
	// Detached starts the server with pg_ctl so that it outlives this
	// process; StopDir stops it later. Otherwise the server is a child of
	// this process and dies with it.
	Detached bool
	// StartTimeout bounds the start; default 60s.
	StartTimeout time.Duration
	// Listen names more addresses the server listens on beside 127.0.0.1
	// (the test cluster's pod network gateway, for a database that pods
	// reach as they would a managed one), and AllowFrom the networks
	// (CIDR) whose clients may log in there, by password.
	Listen    []string
	AllowFrom []string
	// Replication makes the server a primary that standbys stream from
	// (Standby): its WAL is kept at the replica level, it runs WAL senders,
	// and its sessions commit with synchronous_commit on, so that naming a
	// synchronous standby takes effect in every session at once. Without it
	// the server writes minimal WAL and commits asynchronously.
	Replication bool
}

// Server is a running PostgreSQL.
type Server struct {
	dir      string
	port     int
	password string
	listen   []string // beside 127.0.0.1
	bin      binaries
	cred     *syscall.Credential
	detached bool
	// replication: the server runs WAL senders (Options.Replication, and
	// every standby); standbyName is a standby's application name on its
	// primary, "" for a primary.
	replication bool
	standbyName string

	cmd    *exec.Cmd     // the postmaster when not detached
	exited chan struct{} // closed when cmd has exited
	admin  *pgxpool.Pool // to the postgres database, for CREATE/DROP DATABASE
	seq    atomic.Int64
	stop   sync.Once
}

type binaries struct {
	initdb, pgctl, postgres string
	basebackup              string // "" when not found: Standby fails, Start does not
}

// Start initialises and starts a server. Stop it with Stop (or, detached,
// with StopDir).
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	base := opts.BaseDir
	if base == "" {
		base = os.TempDir()
		if cred != nil && !reachableByOthers(base) {
			base = "/tmp"
		}
	}
	removeStale(base)
	dir, err := os.MkdirTemp(base, "reaper-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: make directory: %w", err)
	}
	s := &Server{dir: dir, bin: bin, cred: cred, detached: opts.Detached, password: randomHex(16),
		listen: opts.Listen, replication: opts.Replication}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	if !opts.Detached {
		if err := s.markOwned(); err != nil {
			return nil, err
		}
	}
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	if err := s.allow(opts.AllowFrom); err != nil {
		return nil, err
	}
	if err := s.launch(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// markOwned marks the server's directory as this process's, so a later run
// can tell a leftover (its owner died) from a live one.
func (s *Server) markOwned() error {
	if err := os.WriteFile(filepath.Join(s.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// launch starts the initialised server on a free port and opens its admin
// pool.
func (s *Server) launch(ctx context.Context) error {
	// A free port can be taken between the probe and the bind: try again.
	for attempt := 0; ; attempt++ {
		var err error
		if s.port, err = freePort(); err != nil {
			return err
		}
		err = s.start(ctx)
		if err == nil {
			break
		}
		if attempt == 4 || !strings.Contains(s.logTail(), "could not bind") {
			return fmt.Errorf("%w\n%s", err, s.logTail())
		}
	}
	var err error
	if s.admin, err = pgxpool.New(ctx, s.DSN("postgres")); err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	return nil
}

// Dir is the server's directory (data, log, password).
func (s *Server) Dir() string { return s.dir }

// PID is the postmaster's process id (0 when it is not running): its
// backends are its children.
func (s *Server) PID() int { return postmasterPID(s.dir) }

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// DSN is the connection string of database on the server.
func (s *Server) DSN(database string) string { return s.DSNAt("127.0.0.1", database) }

// DSNAt is DSN through address addr, one of Options.Listen.
func (s *Server) DSNAt(addr, database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Superuser, s.password),
		Host:     net.JoinHostPort(addr, strconv.Itoa(s.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// UniqueName returns a database name not used before on this server.
func (s *Server) UniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, s.seq.Add(1))
}

// CreateDatabase creates database name, as a copy of template when one is
// given.
func (s *Server) CreateDatabase(ctx context.Context, name, template string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := s.admin.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return nil
}

// DropDatabase drops database name, ending its connections.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// Stop stops the server at once and removes its directory. It is safe to
// call more than once.
func (s *Server) Stop() error {
	var err error
	s.stop.Do(func() {
		if s.admin != nil {
			s.admin.Close()
		}
		switch {
		case s.cmd != nil:
			// A frozen server is woken first: its stopped children would
			// never see the postmaster go.
			_ = s.Thaw()
			// SIGQUIT is PostgreSQL's immediate shutdown: nothing to keep.
			_ = s.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-s.exited:
			case <-time.After(30 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		case s.detached && s.port != 0:
			err = s.pgctl(context.Background(), "stop", "-m", "immediate")
		}
		if rmErr := os.RemoveAll(s.dir); rmErr != nil && err == nil {
			err = fmt.Errorf("pgtest: remove %s: %w", s.dir, rmErr)
		}
	})
	return err
}

// StopDir stops a detached server started in dir and removes dir.
func StopDir(dir string) error {
	bin, err := findBinaries()
	if err != nil {
		return err
	}
	cred, err := serverCredential()
	if err != nil {
		return err
	}
	s := &Server{dir: dir, bin: bin, cred: cred, detached: true}
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
		if err := s.pgctl(context.Background(), "stop", "-m", "immediate"); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pgtest: remove %s: %w", dir, err)
	}
	return nil
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *Server) logFile() string { return filepath.Join(s.dir, "postgres.log") }

func (s *Server) initdb(ctx context.Context) error {
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if s.cred != nil {
		for _, p := range []string{s.dir, pwfile} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgtest: hand %s to the server account: %w", p, err)
			}
		}
	}
	out, err := s.command(ctx, s.bin.initdb,
		"-D", s.dataDir(), "-U", Superuser, "--pwfile", pwfile,
		"--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	return nil
}

// allow lets clients of the networks cidrs log in by password.
func (s *Server) allow(cidrs []string) error {
	if len(cidrs) == 0 {
		return nil
	}
	hba := filepath.Join(s.dataDir(), "pg_hba.conf")
	f, err := os.OpenFile(hba, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: open %s: %w", hba, err)
	}
	defer f.Close()
	for _, c := range cidrs {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return fmt.Errorf("pgtest: AllowFrom %q: %w", c, err)
		}
		if _, err := fmt.Fprintf(f, "host all all %s scram-sha-256\n", c); err != nil {
			return fmt.Errorf("pgtest: write %s: %w", hba, err)
		}
	}
	return nil
}

// serverSettings are the server's options: loopback only, no socket file,
// and speed over durability. A server with replication keeps WAL for its
// standbys and leaves synchronous_commit (on) and synchronous_standby_names
// to its configuration files, where ALTER SYSTEM can change them (an option
// on the command line would override it).
func (s *Server) serverSettings() []string {
	wal := []string{"wal_level=minimal", "max_wal_senders=0", "synchronous_commit=off"}
	if s.replication {
		wal = []string{"wal_level=replica", "max_wal_senders=10", "wal_keep_size=256MB"}
	}
	settings := append([]string{
		"listen_addresses=" + strings.Join(append([]string{"127.0.0.1"}, s.listen...), ","),
		"port=" + strconv.Itoa(s.port),
		"unix_socket_directories=",
		"fsync=off",
		"full_page_writes=off",
	}, wal...)
	settings = append(settings,
		"max_wal_size=2GB",
		"checkpoint_timeout=1h",
		"autovacuum=off",
		"max_connections=200",
		"log_min_messages=warning",
		"log_min_error_statement=panic",
	)
	var args []string
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	return args
}

func (s *Server) start(ctx context.Context) error {
	if s.detached {
		opts := strings.Join(s.serverSettings(), " ")
		opts = strings.ReplaceAll(opts, "unix_socket_directories=", "unix_socket_directories=''")
		if err := s.pgctl(ctx, "start", "-w", "-l", s.logFile(), "-o", opts); err != nil {
			return err
		}
		return s.waitReady(ctx)
	}
	logf, err := os.OpenFile(s.logFile(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	cmd := s.command(context.Background(), s.bin.postgres, append([]string{"-D", s.dataDir()}, s.serverSettings()...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with this process even when it is killed outright.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { // owned by the Server: ends when the postmaster does
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	if err := s.waitReady(ctx); err != nil {
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		<-exited
		s.cmd, s.exited = nil, nil
		return err
	}
	return nil
}

// waitReady connects until the server answers, it exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited: // nil when detached: never ready
			return fmt.Errorf("pgtest: postgres exited during start")
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres did not accept connections: %w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func (s *Server) pgctl(ctx context.Context, args ...string) error {
	out, err := s.command(ctx, s.bin.pgctl, append([]string{"-D", s.dataDir()}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl %s: %w\n%s", args[0], err, out)
	}
	return nil
}

// command runs a PostgreSQL binary as the server account.
func (s *Server) command(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// logTail returns the end of the server log, for error messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logFile())
	if err != nil {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// findBinaries finds initdb, pg_ctl and postgres on PATH, else in the
// directory pg_config names.
func findBinaries() (binaries, error) {
	var b binaries
	look := func(dir string) bool {
		find := func(name string) string {
			if dir == "" {
				p, _ := exec.LookPath(name)
				return p
			}
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p
			}
			return ""
		}
		b = binaries{initdb: find("initdb"), pgctl: find("pg_ctl"), postgres: find("postgres")}
		if b.initdb == "" || b.pgctl == "" || b.postgres == "" {
			return false
		}
		// pg_basebackup of the server's own version: beside the real
		// postgres binary (a name on PATH may be a link to it, or a
		// wrapper that picks a version), else wherever the rest was found.
		if real, err := filepath.EvalSymlinks(b.postgres); err == nil {
			p := filepath.Join(filepath.Dir(real), "pg_basebackup")
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				b.basebackup = p
			}
		}
		if b.basebackup == "" {
			b.basebackup = find("pg_basebackup")
		}
		return true
	}
	if look("") {
		return b, nil
	}
	out, err := exec.Command("pg_config", "--bindir").Output()
	if err == nil && look(strings.TrimSpace(string(out))) {
		return b, nil
	}
	return binaries{}, errors.New("pgtest: PostgreSQL server binaries (initdb, pg_ctl, postgres) are neither on PATH " +
		"nor in `pg_config --bindir`; install PostgreSQL (Debian: apt-get install postgresql)")
}

// serverCredential is the account the server runs as: nil (this process's
// own) unless this process is root, which PostgreSQL refuses.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("pgtest: running as root and no unprivileged account (postgres, nobody) to run PostgreSQL as")
}

// reachableByOthers reports whether every directory from / to dir can be
// searched by any account.
func reachableByOthers(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		st, err := os.Stat(dir)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// removeStale removes server directories left in base by test processes
// that died without cleaning up (killed, or a panicking test). A directory
// whose owner process still exists is left alone.
func removeStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "reaper-pgtest-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue // detached, or not ours to judge
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processExists(pid) || postmasterRunning(d) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func postmasterRunning(dir string) bool {
	pid := postmasterPID(dir)
	return pid > 0 && processExists(pid)
}

// postmasterPID is the pid the server in dir recorded; 0 when none.
func postmasterPID(dir string) int {
	f, err := os.Open(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Pause stops the server's postmaster but keeps its directory and port, so
// that Resume can bring the same server back: a database outage, for fault
// tests. It is PostgreSQL's fast shutdown (SIGINT: connections are cut, what
// was committed is kept), not the immediate one Stop uses, since the test
// server runs with asynchronous commit. It needs a server started without
// Detached.
func (s *Server) Pause() error {
	if s.detached || s.cmd == nil {
		return fmt.Errorf("pgtest: pause: the server is detached or not running")
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	<-s.exited
	s.cmd, s.exited = nil, nil
	return nil
}

// Resume starts a paused server again on the same port and directory.
func (s *Server) Resume(ctx context.Context) error {
	if s.detached || s.cmd != nil {
		return fmt.Errorf("pgtest: resume: the server is detached or already running")
	}
	return s.start(ctx)
}
