package soak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dexaflow/reaper/testkit/netfault"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// The ladder of the soak: the specification's order, shortened so that ten
// minutes see hundreds of cycles, tens of leadership changes and every
// threshold crossed many times.
const (
	interval     = 2 * time.Second
	lease        = 3 * time.Second
	heartbeat    = time.Second
	agentLost    = 5 * time.Second
	grace        = 8 * time.Second
	dispatchLost = 10 * time.Second
	orphanRun    = 20 * time.Second
	stopGrace    = 2 * time.Second
	killWait     = 2 * time.Second
	runnerTick   = time.Second
	replicas     = 3
)

// Environment variables the soak hands to reaperd, and through it to
// every plugin, agent and task.
const (
	markEnv = "REAPER_SOAK_MARK" // marks every process of this soak
	escEnv  = "SOAK_ESC"         // where an escaping task writes its escaped child's pid
)

// database is the soak's PostgreSQL: one server, restarted by the injector.
type database struct {
	// mu makes the faults of the database one at a time: a restart, a
	// freeze and the failover each hold it while under way.
	mu      sync.Mutex
	primary *pgtest.Server
	standby *pgtest.Server   // the synchronous standby; nil without one, and after the failover
	dead    []*pgtest.Server // primaries the failover killed, stopped at the end
	// dsn is the soak's own connection string: every server directly, the
	// first that accepts writes taken (the soak's judge is never cut off).
	dsn string
	// links are, by replica slot (1-based: links[slot-1]), the proxies a
	// replica reaches the servers through, in the order of the servers in
	// dsn, and the connection string naming them.
	links []*link
}

// link is one replica's path to the database: a netfault proxy to each
// server, all cut together (a partition of the replica from PostgreSQL,
// whichever server is the primary).
type link struct {
	proxies []*netfault.Proxy
	dsn     string
}

func (l *link) cut() {
	for _, p := range l.proxies {
		p.Cut()
	}
}

func (l *link) heal() {
	for _, p := range l.proxies {
		p.Heal()
	}
}

// startDatabase starts the soak's PostgreSQL in base. With linked > 0 it is
// a primary with a synchronous standby (nothing the primary acknowledged is
// lost when the standby is promoted), and linked replicas each get a link:
// one proxy per server, so a cut partitions the replica from the primary
// and from the standby that may become it, and the replica's connection
// string names both proxies with target_session_attrs=read-write, so it
// follows the promotion as it would follow a managed database's.
func startDatabase(ctx context.Context, base string, linked int) (*database, error) {
	srv, err := pgtest.Start(ctx, pgtest.Options{BaseDir: base, Replication: linked > 0})
	if err != nil {
		return nil, err
	}
	db := &database{primary: srv, dsn: srv.DSN("reaper")}
	ok := false
	defer func() {
		if !ok {
			_ = db.stop()
		}
	}()
	if err := srv.CreateDatabase(ctx, "reaper", ""); err != nil {
		return nil, err
	}
	if linked == 0 {
		ok = true
		return db, nil
	}
	if db.standby, err = srv.Standby(ctx, pgtest.StandbyOptions{Synchronous: true}); err != nil {
		return nil, fmt.Errorf("start the synchronous standby: %w", err)
	}
	servers := []*pgtest.Server{db.primary, db.standby}
	db.dsn = pgtest.FailoverDSN("reaper", servers...)
	for range linked {
		l := &link{}
		db.links = append(db.links, l)
		ports := make([]string, len(servers))
		for i, srv := range servers {
			p, err := netfault.Listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port())))
			if err != nil {
				return nil, err
			}
			l.proxies = append(l.proxies, p)
			_, ports[i], _ = net.SplitHostPort(p.Addr())
		}
		l.dsn = withPorts(db.dsn, ports)
	}
	ok = true
	return db, nil
}

// portsField is the ports of a keyword/value connection string.
var portsField = regexp.MustCompile(`\bport=[0-9,]+`)

// withPorts is dsn with its ports replaced by ports, in order.
func withPorts(dsn string, ports []string) string {
	return portsField.ReplaceAllLiteralString(dsn, "port="+strings.Join(ports, ","))
}

// link is replica slot's link, nil when the replicas reach the database
// directly.
func (db *database) link(slot int) *link {
	if slot < 1 || slot > len(db.links) {
		return nil
	}
	return db.links[slot-1]
}

// acquire takes the database for one fault, waiting for the one under way;
// it reports false, holding nothing, if ctx ended meanwhile (the fault
// phase is over).
func (db *database) acquire(ctx context.Context) bool {
	db.mu.Lock()
	if ctx.Err() != nil {
		db.mu.Unlock()
		return false
	}
	return true
}

func (db *database) release() { db.mu.Unlock() }

// restart stops the primary (fast shutdown: connections cut), keeps it down
// for down, and starts it again on the same port. The caller holds the
// database (acquire).
func (db *database) restart(ctx context.Context, down time.Duration) error {
	if err := db.primary.Pause(); err != nil {
		return err
	}
	sleep(ctx, down)
	return db.primary.Resume(context.WithoutCancel(ctx))
}

// freeze stalls the primary (every one of its processes SIGSTOPped, as a
// hung disk would) for d, then thaws it. The caller holds the database.
func (db *database) freeze(ctx context.Context, d time.Duration) error {
	if err := db.primary.Freeze(); err != nil {
		return err
	}
	sleep(ctx, d)
	return db.primary.Thaw()
}

// canFailOver reports whether a standby is left to promote.
func (db *database) canFailOver() bool { return db.standby != nil }

// failover kills the primary (kill -9 of all its processes: nothing
// flushed, nothing shut down), waits detect, as a failover manager takes
// to notice, and promotes the synchronous standby, which is the primary
// from then on (a restart or a freeze is of it). The caller holds the
// database. It returns once the promoted server accepts writes.
func (db *database) failover(ctx context.Context, detect time.Duration) error {
	if db.standby == nil {
		return errNoTarget
	}
	old := db.primary
	if err := old.Kill(); err != nil {
		return err
	}
	db.dead = append(db.dead, old)
	sleep(context.WithoutCancel(ctx), detect)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	if err := db.standby.Promote(pctx); err != nil {
		return err
	}
	db.primary, db.standby = db.standby, nil
	return nil
}

// stop closes the links and stops every server.
func (db *database) stop() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, l := range db.links {
		for _, p := range l.proxies {
			_ = p.Close()
		}
	}
	var errs []error
	for _, srv := range append([]*pgtest.Server{db.standby, db.primary}, db.dead...) {
		if srv != nil {
			errs = append(errs, srv.Stop())
		}
	}
	return errors.Join(errs...)
}

// configHCL is every replica's configuration on the Lite edition.
// Every replica shares one attempt API address (apiListen) and state
// directory, so an agent reaches whichever replica is up.
func configHCL(bin, dsn, recordDir, logDir, apiListen, apiState string) string {
	leader := fmt.Sprintf("leader \"postgres\" {\n  lease = %q\n}\n", lease)
	return baseHCL(editionLite, bin, dsn, leader, "", apiListen, apiState, "") + fmt.Sprintf(`
substrate "lite" {
  record_dir = %q
  stop_grace = %q
  kill_wait  = %q
}

runner {
  log_dir  = %q
  interval = %q
}

reaper "dispatchlost" {}
reaper "agentlost" {}
reaper "orphanrun" {}
`, recordDir, stopGrace, killWait, logDir, runnerTick)
}

// baseHCL is what both editions' configurations share: the store, the
// leader block given, the cycle, the ladder (with the edition's extra
// lines), telemetry and the attempt API (with apiExtra's lines: the real
// node's certificate).
func baseHCL(edition, bin, dsn, leader, ladderExtra, apiListen, apiState, apiExtra string) string {
	return fmt.Sprintf(`edition    = %q
plugin_dir = %q

store {
  dsn = %q
}

%s
maintenance {
  interval = %q
}

ladder {
  heartbeat      = %q
  agent_lost     = %q
  settling_grace = %q
  dispatch_lost  = %q
  orphan_run     = %q
%s}

telemetry {
  listen = "127.0.0.1:0"
}

attempt_api {
  listen    = %q
  state_dir = %q
%s}
`, edition, bin, dsn, leader, interval, heartbeat, agentLost, grace, dispatchLost, orphanRun, ladderExtra,
		apiListen, apiState, apiExtra)
}

// daemon is one reaperd replica slot: the process running in it now, and
// how to start the next.
type daemon struct {
	slot   int
	bin    string
	config string
	env    []string
	logDir string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
	starts int
	ending bool     // the soak is killing or stopping the process now
	exits  []string // exits the soak did not cause: how each ended
}

// unasked lists the exits of the slot's processes that the soak did not
// cause (a replica that gave up on its own, on a partition for one).
func (d *daemon) unasked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.exits...)
}

func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts++
	logf, err := os.OpenFile(filepath.Join(d.logDir, fmt.Sprintf("reaperd-%d.log", d.slot)),
		os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("reaperd #%d: open its log: %w", d.slot, err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(d.bin, "reaperd"), "run", "-config", d.config)
	cmd.Env = d.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A soak killed outright takes its replicas with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("reaperd #%d: start: %w", d.slot, err)
	}
	done := make(chan struct{})
	go func() { // owned by the daemon: ends when the process does
		err := cmd.Wait()
		d.mu.Lock()
		if !d.ending {
			d.exits = append(d.exits, fmt.Sprintf("pid %d: %v", cmd.Process.Pid, err))
		}
		d.mu.Unlock()
		close(done)
	}()
	d.cmd, d.done, d.paused, d.ending = cmd, done, false, false
	return nil
}

// pid is the running process's id, 0 when none runs.
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.exited() {
		return 0
	}
	return d.cmd.Process.Pid
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// usable: running and not paused.
func (d *daemon) usable() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd != nil && !d.exited() && !d.paused
}

func (d *daemon) signal(sig syscall.Signal) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.exited() {
		return fmt.Errorf("reaperd #%d is not running", d.slot)
	}
	switch sig {
	case syscall.SIGSTOP:
		d.paused = true
	case syscall.SIGCONT:
		d.paused = false
	case syscall.SIGKILL, syscall.SIGTERM:
		d.ending = true
	}
	return d.cmd.Process.Signal(sig)
}

// kill sends SIGKILL and waits for the process.
func (d *daemon) kill() {
	if err := d.signal(syscall.SIGKILL); err != nil {
		return
	}
	<-d.done
}

// stop resumes the process if paused, sends SIGTERM and waits up to bound
// for a clean exit, then kills it. It reports whether it exited cleanly.
func (d *daemon) stop(bound time.Duration) bool {
	if d.pid() == 0 {
		return true
	}
	_ = d.signal(syscall.SIGCONT)
	_ = d.signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return true
	case <-time.After(bound):
		d.kill()
		return false
	}
}

// holderPID is the pid in a lease holder's name: host/pid/random (reaperd's
// default), or host/pid.
func holderPID(holder string) int {
	parts := strings.Split(holder, "/")
	if len(parts) < 2 {
		return 0
	}
	if len(parts) >= 3 {
		parts = parts[:len(parts)-1]
	}
	pid, _ := strconv.Atoi(parts[len(parts)-1])
	return pid
}
