package board

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrDSNInvalid is ParseDSN's error: the DSN does not parse. It never
// carries the DSN's text (the parser's own message may hold a password it
// failed to recognise as one).
var ErrDSNInvalid = errors.New("the DSN is not a valid PostgreSQL connection string " +
	"(a postgres:// URL or key=value pairs; its text is not repeated here)")

// ParseDSN parses a DSN into a pool configuration. Its error is
// ErrDSNInvalid alone.
func ParseDSN(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, ErrDSNInvalid
	}
	return cfg, nil
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
