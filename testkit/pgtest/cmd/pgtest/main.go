// Command pgtest starts and stops a throwaway PostgreSQL from the machine's
// own server binaries, for demos and scripts (tests use package pgtest
// directly).
//
//	pgtest start [-base DIR] [-db NAME]   start a server that outlives the command and
//	                                      print shell assignments of REAPER_DSN and PGTEST_DIR
//	pgtest stop DIR                       stop that server and remove DIR
//
// For example, in a shell:
//
//	eval "$(go run ./internal/pgtest/cmd/pgtest start)"
//	reaperd migrate -config demo.hcl        # reads REAPER_DSN
//	go run ./internal/pgtest/cmd/pgtest stop "$PGTEST_DIR"
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: pgtest start [-base DIR] [-db NAME] | pgtest stop DIR")
		return 2
	}
	switch args[0] {
	case "start":
		fs := flag.NewFlagSet("pgtest start", flag.ContinueOnError)
		fs.SetOutput(stderr)
		base := fs.String("base", "", "directory to make the server's directory in (default: the temporary directory)")
		db := fs.String("db", "reaper", "database to create")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		srv, err := pgtest.Start(ctx, pgtest.Options{BaseDir: *base, Detached: true})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if err := srv.CreateDatabase(ctx, *db, ""); err != nil {
			fmt.Fprintln(stderr, err)
			_ = srv.Stop()
			return 1
		}
		fmt.Fprintf(stdout, "REAPER_DSN=%s\nPGTEST_DIR=%s\nexport REAPER_DSN PGTEST_DIR\n",
			shellQuote(srv.DSN(*db)), shellQuote(srv.Dir()))
		return 0
	case "stop":
		if len(args) != 2 {
			fmt.Fprintln(stderr, "usage: pgtest stop DIR")
			return 2
		}
		if err := pgtest.StopDir(args[1]); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	default:
		fmt.Fprintf(stderr, "pgtest: unknown command %q\n", args[0])
		return 2
	}
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
