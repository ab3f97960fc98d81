// Command historycheck checks fault histories (package history) and prints
// each one's verdict: its counts and every violation, a line each.
//
//	historycheck FILE...
//
// It exits 0 when every history kept every rule, 1 when one broke a rule,
// and 2 when a file could not be read as a history (or none was named).
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/dexaflow/reaper/testkit/history"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK         = 0
	exitViolations = 1
	exitUnreadable = 2
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprintln(stderr, "usage: historycheck FILE...")
		return exitUnreadable
	}
	code := exitOK
	for _, path := range args {
		events, err := history.Read(path)
		if err != nil {
			fmt.Fprintf(stderr, "historycheck: %v\n", err)
			code = exitUnreadable
			continue
		}
		v := history.Check(events)
		fmt.Fprintf(stdout, "%s: %s\n", path, v)
		if !v.OK() && code == exitOK {
			code = exitViolations
		}
	}
	return code
}
