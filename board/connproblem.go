package board

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrDSNInvalid is ParseDSN's error: the DSN does not parse. It never
// carries the DSN's text (the parser's own message may hold a password it
// failed to recognise as one).
var ErrDSNInvalid = errors.New("the DSN is not a valid PostgreSQL connection string " +
	"(a postgres:// URL or key=value pairs; its text is not repeated here)")

// ParseDSN parses a DSN into a pool configuration, fitted by FollowPrimary
// when it names more than one server. Its error is ErrDSNInvalid alone.
func ParseDSN(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrDSNInvalid
	}
	FollowPrimary(cfg)
	return cfg, nil
}

// ConnectTimeoutMultiHostDefault bounds connecting to each server of a DSN
// that names more than one and gives no connect_timeout.
const ConnectTimeoutMultiHostDefault = 3 * time.Second

// FollowPrimary fits a pool configuration whose DSN names more than one
// server (host=a,b port=p,q: a primary and its standbys) to follow a
// failover. A connection is kept only on a server that accepts writes, as
// target_session_attrs=read-write asks: the board is written to, and a
// standby, or an old primary come back read-only, must not take the pool's
// connections. That holds unless the DSN asks for another kind of server
// that accepts writes (target_session_attrs=primary); "any", the default, is
// taken as read-write. And each server has ConnectTimeoutMultiHostDefault to
// answer unless the DSN gives a connect_timeout: a server that hangs rather
// than refuses (stalled, or cut off so that its packets are dropped) would
// otherwise spend a call's whole bound, and the next server, the one
// promoted, would never be tried. A DSN naming one server is left as it is
// (pgx's TLS fallback of sslmode=prefer names the same server twice).
func FollowPrimary(cfg *pgxpool.Config) {
	cc := cfg.ConnConfig
	servers := map[string]bool{net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))): true}
	for _, fb := range cc.Fallbacks {
		servers[net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))] = true
	}
	if len(servers) < 2 {
		return
	}
	if cc.ValidateConnect == nil {
		cc.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = ConnectTimeoutMultiHostDefault
	}
}

// ConnProblem says, in one line, why the database could not be reached or
// refused the connection: for a readiness answer or a log line that must
// not carry the DSN. It names no host, port, user, database or password
// (pgx's own errors name the first four); "" for nil.
func ConnProblem(err error) string {
	var (
		pgErr   *pgconn.PgError
		dnsErr  *net.DNSError
		netErr  net.Error
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrDSNInvalid):
		return ErrDSNInvalid.Error()
	case errors.Is(err, pgconn.ErrReadOnlyConnection), errors.Is(err, pgconn.ErrStandbyConnection):
		// First: the other servers of a multi-host DSN may have refused
		// or failed, but one answered and is not a primary.
		return "no server of the DSN accepts writes: those that answer are standbys " +
			"(a primary down and none promoted yet?)"
	case errors.As(err, &pgErr):
		switch {
		case pgErr.Code == "28P01":
			return "the database refused the password (SQLSTATE 28P01): check the user and password in the DSN"
		case strings.HasPrefix(pgErr.Code, "28"):
			return fmt.Sprintf("the database refused the login (SQLSTATE %s): check the user in the DSN and the server's pg_hba.conf", pgErr.Code)
		case pgErr.Code == "3D000":
			return "the database named in the DSN does not exist (SQLSTATE 3D000)"
		case pgErr.Code == "53300":
			return "the database has no connection left (SQLSTATE 53300: too many connections)"
		case strings.HasPrefix(pgErr.Code, "57P"):
			return fmt.Sprintf("the database is starting up or shutting down (SQLSTATE %s)", pgErr.Code)
		default:
			return fmt.Sprintf("the database refused the request (SQLSTATE %s)", pgErr.Code)
		}
	case errors.As(err, &dnsErr):
		return "the host name in the DSN does not resolve"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens at the host and port of the DSN"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the host of the DSN"
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid),
		strings.Contains(err.Error(), "server refused TLS connection"):
		return "the TLS connection to the database failed: check sslmode in the DSN and the server's certificate"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "the database did not answer in time"
	default:
		return "the database cannot be reached"
	}
}
