package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configure Standby.
type StandbyOptions struct {
	// Synchronous makes the standby the primary's one synchronous standby
	// (synchronous_standby_names names it alone): from the moment Standby
	// returns, a commit on the primary returns only once the standby has
	// flushed its WAL, so promoting the standby loses nothing the primary
	// acknowledged. Otherwise the standby is asynchronous: the primary
	// acknowledges a commit without waiting, and what the standby had not
	// received when the primary died is lost at its promotion.
	Synchronous bool
	// StartTimeout bounds the base backup and the start; default 60s.
	StartTimeout time.Duration
}

// Standby makes a streaming-replication standby of the server: a base
// backup (pg_basebackup -R, WAL streamed alongside) into a directory of its
// own, started as a hot standby on a free loopback port, as the same
// account, with the server's superuser and password. It returns once the
// standby streams from the server (and, synchronous, once the server waits
// for it). Stop it with Stop; it is independent of the server: it outlives
// the server's Kill, and Promote makes it a primary.
//
// The server must have been started with Options.Replication and without
// Detached.
func (s *Server) Standby(ctx context.Context, opts StandbyOptions) (*Server, error) {
	switch {
	case !s.replication:
		return nil, fmt.Errorf("pgtest: standby: the server was started without Options.Replication")
	case s.detached || s.cmd == nil:
		return nil, fmt.Errorf("pgtest: standby: the server is detached or not running")
	case s.bin.basebackup == "":
		return nil, fmt.Errorf("pgtest: standby: pg_basebackup is neither beside postgres nor on PATH")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	dir, err := os.MkdirTemp(filepath.Dir(s.dir), "reaper-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: standby: make directory: %w", err)
	}
	st := &Server{dir: dir, bin: s.bin, cred: s.cred, password: s.password, replication: true,
		standbyName: s.UniqueName("standby")}
	ok := false
	defer func() {
		if !ok {
			st.Stop()
		}
	}()
	if err := st.markOwned(); err != nil {
		return nil, err
	}
	if st.cred != nil {
		if err := os.Chown(dir, int(st.cred.Uid), int(st.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: standby: hand %s to the server account: %w", dir, err)
		}
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s sslmode=disable application_name=%s",
		s.port, Superuser, st.standbyName)
	cmd := st.command(ctx, s.bin.basebackup, "-d", conninfo, "-D", st.dataDir(),
		"-R", "-X", "stream", "-c", "fast", "--no-sync")
	cmd.Env = append(cmd.Env, "PGPASSWORD="+s.password)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: standby: pg_basebackup: %w\n%s", err, out)
	}
	// -R wrote standby.signal and a primary_conninfo; this one, appended
	// (the last setting wins), carries the password and the standby's
	// name, which synchronous_standby_names and pg_stat_replication use.
	auto := filepath.Join(st.dataDir(), "postgresql.auto.conf")
	line := fmt.Sprintf("primary_conninfo = '%s password=%s'\n", conninfo, s.password)
	if err := appendFile(auto, line); err != nil {
		return nil, fmt.Errorf("pgtest: standby: %w", err)
	}
	if err := st.launch(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: standby: %w", err)
	}
	if opts.Synchronous {
		err = s.nameSynchronous(ctx, st.standbyName)
	} else {
		err = s.waitSyncState(ctx, st.standbyName, "async")
	}
	if err != nil {
		return nil, fmt.Errorf("pgtest: standby: %w", err)
	}
	ok = true
	return st, nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// nameSynchronous makes the standby named name the server's synchronous
// standby and returns once every session waits for it.
//
// A session decides whether to wait from a flag in shared memory that the
// checkpointer sets when it takes in a reloaded configuration. A fresh
// session that sees the standby as "sync" was forked after the postmaster
// took the new configuration in and signalled its children, the
// checkpointer among them; the checkpointer handles that signal at the
// latest before the second checkpoint asked of it after that, so two
// CHECKPOINTs close the gap without waiting on a clock.
func (s *Server) nameSynchronous(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(name)); err != nil {
		return fmt.Errorf("name the synchronous standby: %w", err)
	}
	if _, err := s.admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("reload the configuration: %w", err)
	}
	if err := s.waitSyncState(ctx, name, "sync"); err != nil {
		return err
	}
	for range 2 {
		if _, err := s.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return nil
}

// Desynchronize makes a synchronous standby of primary asynchronous:
// primary's synchronous_standby_names is emptied and reloaded, and
// Desynchronize returns once no session of primary waits for the standby
// any more, and the standby streams as "async". From then on primary
// acknowledges a commit without the standby; with StopStreaming after it,
// what primary commits is acknowledged and never reaches the standby (a
// failover manager that gave up on synchronous replication, an operator who
// lifted it to keep the primary writing). What was committed before
// Desynchronize was called had reached the standby.
//
// As in naming a synchronous standby, a session decides whether to wait
// from a flag the checkpointer keeps; when the checkpointer takes in the
// emptied setting it clears the flag and releases every session waiting,
// and two CHECKPOINTs asked after the reload make sure it has.
func (s *Server) Desynchronize(ctx context.Context, primary *Server) error {
	if s.standbyName == "" {
		return fmt.Errorf("pgtest: desynchronize: not a standby")
	}
	if _, err := primary.admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = ''"); err != nil {
		return fmt.Errorf("pgtest: desynchronize: %w", err)
	}
	if _, err := primary.admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: desynchronize: reload the configuration: %w", err)
	}
	for range 2 {
		if _, err := primary.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("pgtest: desynchronize: checkpoint: %w", err)
		}
	}
	if err := primary.waitSyncState(ctx, s.standbyName, "async"); err != nil {
		return fmt.Errorf("pgtest: desynchronize: %w", err)
	}
	return nil
}

// waitSyncState waits until the standby named name streams from the server
// in sync state want ("sync", "async"), as a fresh session sees it.
func (s *Server) waitSyncState(ctx context.Context, name, want string) error {
	var last string
	err := poll(ctx, func() (bool, error) {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			return false, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var state, sync string
		err = conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`,
			name).Scan(&state, &sync)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			last = "not connected"
			return false, nil
		case err != nil:
			return false, err
		}
		last = state + "/" + sync
		return state == "streaming" && sync == want, nil
	})
	if err != nil {
		return fmt.Errorf("wait for standby %s to stream (%s): %w (last: %s)", name, want, err, last)
	}
	return nil
}

// StopStreaming makes a standby stop receiving WAL: its primary_conninfo is
// emptied and its WAL receiver ends. What it received before is kept and
// replayed; nothing its primary commits afterwards reaches it. Asynchronous,
// this is a standby that fell behind: call WaitCaughtUp first to fix what
// it holds, write on the primary, Kill the primary and Promote the standby,
// and the writes after the stop are lost though the primary acknowledged
// them. (A synchronous standby that stops streaming makes its primary's
// commits wait.)
//
// The receiver is ended, not frozen with SIGSTOP: a frozen receiver leaves
// the primary's WAL queued in its socket, and whether that WAL would reach
// the standby once the promotion wakes the receiver to end it depends on the
// order in which the receiver meets the two; ending it leaves nothing in
// flight.
func (s *Server) StopStreaming(ctx context.Context) error {
	if s.standbyName == "" {
		return fmt.Errorf("pgtest: stop streaming: not a standby")
	}
	if _, err := s.admin.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return fmt.Errorf("pgtest: stop streaming: %w", err)
	}
	if _, err := s.admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: stop streaming: reload the configuration: %w", err)
	}
	err := poll(ctx, func() (bool, error) {
		var n int
		err := s.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
		return n == 0, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: stop streaming: wait for the WAL receiver to end: %w", err)
	}
	return nil
}

// Promote makes a standby a primary (pg_promote) and returns once it
// accepts writes. What it had received is replayed first; what it had not
// is gone.
func (s *Server) Promote(ctx context.Context) error {
	var done bool
	if err := s.admin.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&done); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !done {
		return fmt.Errorf("pgtest: promote: the standby was not promoted within 60s\n%s", s.logTail())
	}
	s.standbyName = ""
	return nil
}

// LSN is a position in the WAL.
type LSN uint64

// ParseLSN parses PostgreSQL's text form of a WAL position, "16/B374D848".
func ParseLSN(text string) (LSN, error) {
	hi, lo, ok := strings.Cut(text, "/")
	if !ok {
		return 0, fmt.Errorf("pgtest: parse LSN %q: no /", text)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pgtest: parse LSN %q: not two hexadecimal numbers", text)
	}
	return LSN(h<<32 | l), nil
}

func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint64(l)&0xFFFFFFFF) }

// InsertLSN is the end of the last record written to the server's WAL
// (pg_current_wal_insert_lsn): everything committed so far lies before it.
func (s *Server) InsertLSN(ctx context.Context) (LSN, error) {
	return s.lsn(ctx, "pg_current_wal_insert_lsn()")
}

// ReplayLSN is the end of the last record a standby has replayed
// (pg_last_wal_replay_lsn): what a query on it sees.
func (s *Server) ReplayLSN(ctx context.Context) (LSN, error) {
	return s.lsn(ctx, "pg_last_wal_replay_lsn()")
}

func (s *Server) lsn(ctx context.Context, fn string) (LSN, error) {
	var text *string
	if err := s.admin.QueryRow(ctx, "SELECT "+fn+"::text").Scan(&text); err != nil {
		return 0, fmt.Errorf("pgtest: read %s: %w", fn, err)
	}
	if text == nil {
		return 0, fmt.Errorf("pgtest: read %s: null (not a standby?)", fn)
	}
	return ParseLSN(*text)
}

// WaitCaughtUp waits until the standby has replayed everything primary had
// written when WaitCaughtUp was called, or ctx ends.
func (s *Server) WaitCaughtUp(ctx context.Context, primary *Server) error {
	target, err := primary.InsertLSN(ctx)
	if err != nil {
		return err
	}
	var at LSN
	err = poll(ctx, func() (bool, error) {
		at, err = s.ReplayLSN(ctx)
		return at >= target, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait for the standby to replay %s (at %s): %w", target, at, err)
	}
	return nil
}

// FailoverDSN is a connection string of database that names every one of
// servers, in order (a primary and its standbys), with
// target_session_attrs=read-write: a client takes the first that accepts
// writes, so a new connection made after a promotion reaches the promoted
// standby. It is in keyword/value form, as an operator would write it.
func FailoverDSN(database string, servers ...*Server) string {
	hosts, ports := make([]string, len(servers)), make([]string, len(servers))
	for i, s := range servers {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(s.port)
	}
	return fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s sslmode=disable target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","), Superuser, servers[0].password, database)
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// poll calls done every few milliseconds until it reports true, returns an
// error, or ctx ends. It paces a wait for a state the server reaches on its
// own; it is no threshold.
func poll(ctx context.Context, done func() (bool, error)) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}
