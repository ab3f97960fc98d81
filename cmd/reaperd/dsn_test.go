package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/pgtest"
	"github.com/dexaflow/reaper/testkit/unpriv"
)

// TestReaperdsDSN: the board's DSN reaches reaperd without reaching anyone
// else. Given in REAPER_DSN, it is in the environment the kernel shows as
// reaperd's /proc/<pid>/environ: the real reaperd, run as an unprivileged
// user, makes itself non-dumpable first, so a process of that same user is
// refused that file, while it reads a dumpable process's. Given in a file
// (store.dsn_file), reaperd reads it; given both ways in the file, it is
// refused at the line.
func TestReaperdsDSN(t *testing.T) {
	dsn := pgtest.NewDSN(t)
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reaperd := filepath.Join(binDir, "reaperd")

	t.Run("DSNFileIsRead", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "reaper.hcl")
		src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn_file = %q\n}\nsubstrate \"lite\" {}\n", binDir, dsnFile)
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(reaperd, "migrate", "-config", path)
		cmd.Env = append(os.Environ(), "REAPER_DSN=", "REAPER_DSN_FILE=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("reaperd migrate with store.dsn_file: %v\n%s", err, out)
		}
	})

	t.Run("DSNAndDSNFileRefusedAtTheLine", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "reaper.hcl")
		src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nstore {\n  dsn      = %q\n  dsn_file = %q\n}\nsubstrate \"lite\" {}\n",
			binDir, dsn, dsnFile)
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, command := range []string{"validate", "run"} {
			cmd := exec.Command(reaperd, command, "-config", path)
			cmd.Env = append(os.Environ(), "REAPER_DSN=", "REAPER_DSN_FILE=")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), path+":5:") || !strings.Contains(string(out), "exclude each other") {
				t.Errorf("reaperd %s: %v\n%s\nwant a refusal at %s:5", command, err, out, path)
			}
		}
	})

	t.Run("EnvironRefusedToAProcessOfTheSameUser", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: to run reaperd and the reader as one unprivileged user")
		}
		acct := unpriv.Find(t)
		base, err := os.MkdirTemp("", "reaperd-dsn-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(base) })
		if err := os.Chmod(base, 0o755); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(base, "bin")
		if err := os.Mkdir(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"reaperd", "reaper-substrate-lite"} {
			unpriv.CopyFile(t, filepath.Join(binDir, name), filepath.Join(bin, name), 0o755)
		}
		work := filepath.Join(base, "work")
		if err := os.Mkdir(work, 0o700); err != nil {
			t.Fatal(err)
		}
		config := filepath.Join(work, "reaper.hcl")
		if err := os.WriteFile(config, []byte(fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\n%s\nsubstrate \"lite\" {}\n",
			bin, fastLadder)), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{work, config} {
			if err := os.Chown(p, acct.UID, acct.GID); err != nil {
				t.Fatal(err)
			}
		}
		const canary = "canary-password-91be"
		secretDSN := dsn + "&application_name=" + canary
		cmd := exec.Command(filepath.Join(bin, "reaperd"), "run", "-config", config)
		cmd.Env = []string{"REAPER_DSN=" + secretDSN, "TMPDIR=" + work, "PATH=" + os.Getenv("PATH")}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		logged := make(chan string, 1)
		var (
			mu   sync.Mutex
			logs bytes.Buffer
		)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				mu.Lock()
				logs.WriteString(sc.Text() + "\n")
				mu.Unlock()
				select {
				case logged <- sc.Text():
				default:
				}
			}
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		// A line logged is past main's first line.
		select {
		case <-logged:
		case <-time.After(30 * time.Second):
			t.Fatal("reaperd logged nothing in 30s")
		}
		environ := fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid)
		if b, err := os.ReadFile(environ); err != nil || !strings.Contains(string(b), canary) {
			t.Fatalf("root reads reaperd's environ: %v; the canary is there: %v (else this proves nothing)", err, strings.Contains(string(b), canary))
		}
		control := exec.Command("sleep", "300")
		control.Env = []string{"CONTROL=" + canary}
		control.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
		if err := control.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = control.Process.Kill()
			_ = control.Wait()
		})
		read := func(path string) (string, error) {
			c := exec.Command("cat", path)
			c.SysProcAttr = &syscall.SysProcAttr{Credential: acct.Credential()}
			out, err := c.CombinedOutput()
			return string(out), err
		}
		if out, err := read(environ); err == nil || strings.Contains(out, canary) || !strings.Contains(out, "Permission denied") {
			t.Errorf("uid %d reading reaperd's environ: %v\n%s\nwant Permission denied", acct.UID, err, out)
		}
		if out, err := read(fmt.Sprintf("/proc/%d/environ", control.Process.Pid)); err != nil || !strings.Contains(out, canary) {
			t.Errorf("uid %d reading a dumpable process of its own: %v\n%s\nwant it read (else the refusal proves nothing)", acct.UID, err, out)
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("reaperd's log:\n%s", logs.String())
			mu.Unlock()
		}
	})
}
