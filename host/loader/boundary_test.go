package loader_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/plugin"
)

// ownDir is a fresh plugin directory holding a copy of the test reaper as
// reaper-<name>, mode 0755, in a directory of mode 0700.
func ownDir(t *testing.T, name string) (dir, bin string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(pluginDir, "reaper-echo"))
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "reaper-"+name)
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

func launchFrom(t *testing.T, ld *loader.Loader, spec loader.Spec) (*loader.Plugin, error) {
	t.Helper()
	if ld.Logger == nil {
		ld.Logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := ld.Launch(ctx, spec)
	if err == nil {
		t.Cleanup(p.Kill)
	}
	return p, err
}

// A plugin starts with none of the host's environment but what the host
// passes on purpose: no DSN, no PG*, nothing secret. The real plugin dumps
// its environment as its pass's state.
func TestPluginEnvironmentHoldsNoSecret(t *testing.T) {
	for k, v := range map[string]string{
		"REAPER_DSN": "postgres://reaper:hunter2@db/reaper", "PGPASSWORD": "hunter2", "PGHOST": "db",
		"REAPER_WORKER_TOKEN": "secret", "AWS_SECRET_ACCESS_KEY": "secret", "TZ": "UTC",
	} {
		t.Setenv(k, v)
	}
	p, err := launch(t, loader.Spec{Kind: sdk.KindReaper, Name: "echo"}, "REAPER_PASSED_ON_PURPOSE=yes")
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	configure(t, p, "env")
	res, err := p.Reaper().Reap(context.Background(), sdk.Pass{Now: time.Now(), Term: 1}, &recordingBoard{}, scriptedExec{}, nopSink{})
	if err != nil {
		t.Fatalf("reap: %v", err)
	}
	env := strings.Split(string(res.State), "\x00")
	keys := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
		if strings.HasPrefix(k, "PG") || strings.Contains(kv, "hunter2") || strings.Contains(k, "SECRET") ||
			strings.Contains(k, "TOKEN") || k == "REAPER_DSN" {
			t.Errorf("the plugin's environment holds %s", kv)
		}
	}
	for _, want := range []string{plugin.MagicCookieKey, "PLUGIN_CLIENT_CERT", "TZ", "REAPER_PASSED_ON_PURPOSE"} {
		if !keys[want] {
			t.Errorf("the plugin's environment lacks %s: %v", want, keys)
		}
	}
	for k := range keys {
		known := strings.HasPrefix(k, "PLUGIN_") || k == plugin.MagicCookieKey || k == "REAPER_PASSED_ON_PURPOSE"
		for _, p := range loader.PassedEnv {
			known = known || k == p
		}
		if !known {
			t.Errorf("the plugin's environment holds %s, which the host does not pass", k)
		}
	}
}

type nopSink struct{}

func (nopSink) Record(context.Context, []sdk.Decision) error { return nil }

// The loader refuses a plugin binary, or a directory, that anybody but
// reaperd's user (or root) could change, and says which file and why.
func TestLoaderRefusesABinaryOthersCouldChange(t *testing.T) {
	spec := loader.Spec{Kind: sdk.KindReaper, Name: "perm"}
	t.Run("WorldWritableBinaryRefused", func(t *testing.T) {
		dir, bin := ownDir(t, "perm")
		if err := os.Chmod(bin, 0o777); err != nil {
			t.Fatal(err)
		}
		_, err := launchFrom(t, &loader.Loader{Dir: dir}, spec)
		refused(t, err, bin, "writable by group or others")
	})
	t.Run("GroupWritableBinaryRefused", func(t *testing.T) {
		dir, bin := ownDir(t, "perm")
		if err := os.Chmod(bin, 0o775); err != nil {
			t.Fatal(err)
		}
		_, err := launchFrom(t, &loader.Loader{Dir: dir}, spec)
		refused(t, err, bin, "writable by group or others")
	})
	t.Run("DirectoryWritableByOthersRefused", func(t *testing.T) {
		dir, _ := ownDir(t, "perm")
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		_, err := launchFrom(t, &loader.Loader{Dir: dir}, spec)
		refused(t, err, dir, "writable by group or others")
	})
	t.Run("BinaryOwnedByAnotherUserRefused", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving a file to another user needs root")
		}
		dir, bin := ownDir(t, "perm")
		if err := os.Chown(bin, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		_, err := launchFrom(t, &loader.Loader{Dir: dir}, spec)
		refused(t, err, bin, "owned by uid 65534")
	})
	t.Run("SymlinkIsResolvedAndItsTargetChecked", func(t *testing.T) {
		dir, _ := ownDir(t, "perm")
		other, target := ownDir(t, "target")
		if err := os.Symlink(target, filepath.Join(dir, "reaper-link")); err != nil {
			t.Fatal(err)
		}
		// A target others may change is refused, named by its own path.
		if err := os.Chmod(other, 0o777); err != nil {
			t.Fatal(err)
		}
		_, err := launchFrom(t, &loader.Loader{Dir: dir}, loader.Spec{Kind: sdk.KindReaper, Name: "link"})
		refused(t, err, other, "writable by group or others")
	})
}

func refused(t *testing.T, err error, file, why string) {
	t.Helper()
	if err == nil {
		t.Fatal("launched, want a refusal")
	}
	if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), why) {
		t.Fatalf("refusal %q does not name %s and %q", err, file, why)
	}
}

// The binary is opened once: what is hashed is what runs. A file swapped
// in at the path after the hash check (the hook runs between the check and
// the start) never runs; the checked one does.
func TestSwappedBinaryAfterTheHashCheckNeverRuns(t *testing.T) {
	dir, bin := ownDir(t, "swapped")
	sum := fileSHA256(t, bin)
	marker := filepath.Join(t.TempDir(), "the-swapped-binary-ran")
	ld := &loader.Loader{Dir: dir}
	loader.SetBeforeStart(ld, func(path string) {
		evil := filepath.Join(dir, "evil")
		if err := os.WriteFile(evil, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(evil, path); err != nil {
			t.Error(err)
		}
	})
	p, err := launchFrom(t, ld, loader.Spec{Kind: sdk.KindReaper, Name: "swapped", SHA256: sum})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	if p.Info.Name != "swapped" {
		t.Fatalf("info %+v: not the checked binary", p.Info)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the binary swapped in after the check ran")
	}
	if fileSHA256(t, bin) == sum {
		t.Fatal("the hook did not swap the binary")
	}
}

// A reply larger than the host accepts is refused unread, cleanly: the
// call fails as too large, and the plugin and the host go on.
func TestOversizedReplyRefusedHostAlive(t *testing.T) {
	p, err := launchFrom(t, &loader.Loader{Dir: pluginDir, MaxReply: 1 << 20}, loader.Spec{Kind: sdk.KindReaper, Name: "echo"})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	configure(t, p, "big_reply")
	_, err = p.Reaper().Reap(context.Background(), sdk.Pass{Now: time.Now(), Term: 1}, &recordingBoard{}, scriptedExec{}, nopSink{})
	if !plugin.IsReplyTooLarge(err) {
		t.Fatalf("reap: %v, want a reply refused as too large", err)
	}
	configure(t, p, "env")
	if _, err := p.Reaper().Reap(context.Background(), sdk.Pass{Now: time.Now(), Term: 1}, &recordingBoard{}, scriptedExec{}, nopSink{}); err != nil {
		t.Fatalf("the next pass after the refused reply: %v", err)
	}
	if p.Exited() {
		t.Fatal("the plugin died of the refused reply")
	}
}
