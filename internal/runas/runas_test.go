package runas_test

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dexaflow/reaper/internal/runas"
)

// helperEnv, when set, makes this test binary print what CheckCanSwitch
// says instead of running tests (re-run as an unprivileged user).
const helperEnv = "RUNAS_TEST_CHECK"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		if err := runas.CheckCanSwitch(); err != nil {
			os.Stdout.WriteString("refused: " + err.Error())
		} else {
			os.Stdout.WriteString("allowed")
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func nobody(t *testing.T) *user.User {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil || u.Uid == "0" {
		t.Skip("no unprivileged user nobody")
	}
	return u
}

func TestLookup(t *testing.T) {
	t.Run("AnUnprivilegedUserResolvesWithItsGroupsAndNotRoots", func(t *testing.T) {
		n := nobody(t)
		if strconv.Itoa(os.Geteuid()) == n.Uid {
			t.Skip("the test runs as nobody")
		}
		for _, name := range []string{"nobody", n.Uid} {
			u, err := runas.Lookup(name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if strconv.Itoa(int(u.UID)) != n.Uid || strconv.Itoa(int(u.GID)) != n.Gid || u.Name != "nobody" {
				t.Fatalf("%s: %+v, want nobody's ids", name, u)
			}
			for _, g := range u.Credential().Groups {
				if g == 0 {
					t.Fatalf("%s: root's group among %v", name, u.Credential().Groups)
				}
			}
			if env := strings.Join(u.Env(), " "); !strings.Contains(env, "USER=nobody") || !strings.Contains(env, "HOME=") {
				t.Fatalf("env %q", env)
			}
		}
	})
	t.Run("RootUnknownAndOwnUserAreRefused", func(t *testing.T) {
		self, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]string{
			"root":                  "is root",
			"no-such-user-anywhere": "unknown user",
			self.Username:           "",
			"":                      "no user named",
		} {
			_, err := runas.Lookup(name)
			if err == nil {
				t.Errorf("%q accepted", name)
			} else if want != "" && !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %v, want %q", name, err, want)
			}
		}
	})
}

// TestCheckCanSwitch_RefusedWithoutRootOrCapabilities runs this binary as
// an unprivileged user: it cannot switch users, and says so.
func TestCheckCanSwitch_RefusedWithoutRootOrCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		if err := runas.CheckCanSwitch(); err == nil {
			t.Skip("this unprivileged test process holds CAP_SETUID and CAP_SETGID")
		}
		return
	}
	if err := runas.CheckCanSwitch(); err != nil {
		t.Fatalf("root refused: %v", err)
	}
	n := nobody(t)
	uid, _ := strconv.Atoi(n.Uid)
	gid, _ := strconv.Atoi(n.Gid)
	dir, err := os.MkdirTemp("", "runas-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := dir + "/runas.test"
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", self, bin).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{helperEnv + "=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "refused: run_as needs reaperd to run as root or with CAP_SETUID and CAP_SETGID") {
		t.Fatalf("as nobody: %q, want the refusal", out)
	}
}
