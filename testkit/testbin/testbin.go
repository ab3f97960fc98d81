// Package testbin builds the programs a test binary runs (reaperd, its
// plugins, the agent) once, in its TestMain, into a temporary directory.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Build builds the main packages pkgs (import paths, or paths relative to
// the test's directory) with one go build, which builds them in parallel,
// into a new temporary directory whose name starts with prefix; each
// binary is named after its package. go build's output goes to stderr.
// remove deletes the directory.
func Build(prefix string, pkgs ...string) (dir string, remove func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, fmt.Errorf("make the binary directory: %w", err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, pkgs...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		remove()
		return "", nil, fmt.Errorf("build %v: %w", pkgs, err)
	}
	return dir, remove, nil
}

// Main is the body of a TestMain whose tests need built programs: it
// builds pkgs (Build, the directory named after name), hands the
// directory to run, which runs the tests (m.Run, or a harness around it),
// removes the directory and returns run's exit code. A failed build runs
// no test: it says why on stderr, prefixed with name, and returns 2.
//
//	func TestMain(m *testing.M) {
//		os.Exit(testbin.Main(m, "e2e", packages, func(m *testing.M, bin string) int {
//			binDir = bin
//			return pgtest.Run(m)
//		}))
//	}
func Main(m *testing.M, name string, pkgs []string, run func(m *testing.M, bin string) int) int {
	dir, remove, err := Build("reaper-"+name+"-bin-", pkgs...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	defer remove()
	return run(m, dir)
}
