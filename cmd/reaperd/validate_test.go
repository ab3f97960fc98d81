package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateCommand(t *testing.T) {
	write := func(t *testing.T, body string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "reaper.hcl")
		src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nsubstrate \"lite\" {}\n%s", binDir, body)
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	validate := func(path string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"validate", "-config", path}, &out, &errb)
		return code, out.String(), errb.String()
	}

	t.Run("ValidFileStartsAndConfiguresEveryPlugin", func(t *testing.T) {
		code, out, errs := validate(write(t, "reaper \"echo\" {\n  mode = \"normal\"\n}\n"))
		if code != 0 || !strings.Contains(out, "valid") {
			t.Fatalf("code %d out %q err %q", code, out, errs)
		}
	})
	cases := []struct {
		name, body, want string
	}{
		{"UnknownKeyInAPluginBlock", "reaper \"echo\" {\n  mood = \"normal\"\n}\n", `reaper.hcl:5:3: Unsupported argument: An argument named "mood"`},
		{"WrongTypeInAPluginBlock", "reaper \"echo\" {\n  threshold = \"soon\"\n}\n", `reaper.hcl:5:15: Invalid value for "threshold"`},
		{"ValueThePluginRefuses", "reaper \"echo\" {\n  mode = \"sideways\"\n}\n", `reaper.hcl:5:10: reaper plugin "echo" refused its configuration: attribute "mode": must be "normal"`},
		{"MissingPluginBinary", "reaper \"nosuch\" {}\n", `reaper.hcl:4:1: reaper plugin "nosuch"`},
		{"ChecksumMismatch", "reaper \"echo\" {\n  sha256 = \"" + strings.Repeat("0", 64) + "\"\n}\n", "checksum mismatch"},
		{"LadderOutOfOrder", "ladder {\n  agent_lost = \"10s\"\n}\n", "reaper.hcl:5:16: Timing ladder out of order: agent_lost (10s) must be greater than heartbeat (15s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := validate(write(t, tc.body))
			if code == 0 || !strings.Contains(errs, tc.want) {
				t.Fatalf("code %d, stderr %q, want it to contain %q", code, errs, tc.want)
			}
		})
	}
	t.Run("UsageErrors", func(t *testing.T) {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"validate"}, &out, &errb); code != 2 {
			t.Fatalf("code %d", code)
		}
		if code := run(context.Background(), []string{"frobnicate"}, &out, &errb); code != 2 {
			t.Fatalf("code %d", code)
		}
		if code := run(context.Background(), []string{"version"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "plugin protocol 1") {
			t.Fatalf("version: %d %q", code, out.String())
		}
	})
}

// validateFile runs reaperd validate in process on a file holding src.
func validateFile(t *testing.T, src string) (code int, stdout, stderr string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reaper.hcl")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code = run(context.Background(), []string{"validate", "-config", path}, &out, &errb)
	return code, out.String(), errb.String()
}

func TestValidateReportsEveryProblemOfTheFile(t *testing.T) {
	src := fmt.Sprintf(`edition    = "lite"
plugin_dir = %q
ladder {
  agent_lost = "10s"
}
substrate "lite" {}
reaper "nosuch" {}
reaper "echo" {
  mode = "sideways"
}
`, binDir)
	code, _, errs := validateFile(t, src)
	if code != 1 {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	want := []string{
		"reaper.hcl:4:16: Timing ladder out of order: agent_lost (10s) must be greater than heartbeat (15s)",
		`reaper.hcl:7:1: reaper plugin "nosuch" (` + filepath.Join(binDir, "reaper-nosuch") + `): binary not found`,
		`reaper.hcl:9:10: reaper plugin "echo" refused its configuration: attribute "mode": must be "normal", "crash", "crash_once", "hang", "report", "report_fail", "mark_teardown", "mark_crash", "forge_success", "late_write", "big_reply", "env", "probe", "backdate", "confirm", "foreign_name" or "undeclared_label", not "sideways"`,
	}
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d problems reported, want %d:\n%s", len(lines), len(want), errs)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], string(filepath.Separator)+w) {
			t.Errorf("problem %d:\n got  %s\n want %s...", i+1, lines[i], w)
		}
	}
	if strings.Contains(errs, "rpc error") {
		t.Errorf("a gRPC status leaked into the report:\n%s", errs)
	}
}

// snapshot lists every entry under the roots with its type, mode and size.
func snapshot(t *testing.T, roots ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			size := info.Size()
			if info.IsDir() {
				size = 0
			}
			out[path] = fmt.Sprintf("%s %d", info.Mode(), size)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestValidateLeavesTheFileSystemAsItFoundIt(t *testing.T) {
	// The real Lite substrate, with its record directory left to the
	// default under $TMPDIR, and a real reaper; no database.
	tmp := shortTempDir(t)
	t.Setenv("TMPDIR", tmp)
	cfgDir := t.TempDir()
	path := filepath.Join(cfgDir, "reaper.hcl")
	src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nsubstrate \"lite\" {}\nreaper \"agentlost\" {}\n",
		filepath.Join(binDir, realDir))
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, tmp, cfgDir)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", "-config", path}, &out, &errb); code != 0 {
		t.Fatalf("code %d, stderr %s", code, errb.String())
	}
	after := snapshot(t, tmp, cfgDir)
	for p, v := range after {
		if before[p] != v {
			t.Errorf("validate left %s (%s)", p, v)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("validate removed %s", p)
		}
	}
}

func TestKubeEditionValidates(t *testing.T) {
	// The real kube substrate and the five reapers. Configuring the
	// substrate builds its client from the kubeconfig without reaching the
	// cluster, so an address nothing listens on will do.
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: c
  context:
    cluster: c
    user: u
current-context: c
users:
- name: u
  user:
    token: t
`), 0o600); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf("edition = \"kube\"\nplugin_dir = %q\nsubstrate \"kube\" {\n  namespace = \"tasks\"\n  kubeconfig = %q\n}\n"+
		"reaper \"dispatchlost\" {}\nreaper \"podlost\" {}\nreaper \"agentlost\" {}\nreaper \"warmworker\" {}\nreaper \"orphanrun\" {}\n",
		filepath.Join(binDir, kubeDir), kubeconfig)
	path := filepath.Join(dir, "reaper.hcl")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"validate", "-config", path}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "edition kube, substrate kube, reapers [dispatchlost podlost agentlost warmworker orphanrun]") {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// shortTempDir is a fresh directory with a short path, removed after the
// test: it stands for $TMPDIR, under which unix sockets are made, and a
// socket's path is limited to about 100 bytes.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// podlost and warmworker judge pods and warm workers, which Lite has none
// of: their plugins declare the kube edition only, and reaperd validate
// refuses either in a Lite file with an error at its block naming the
// reaper and the edition, while the rest of the file is still checked.
func TestKubeOnlyReapersRefusedOnLite(t *testing.T) {
	for _, name := range []string{"podlost", "warmworker"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("TMPDIR", shortTempDir(t))
			src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nsubstrate \"lite\" {}\nreaper \"agentlost\" {}\nreaper %q {}\n",
				filepath.Join(binDir, realDir), name)
			code, _, errs := validateFile(t, src)
			want := fmt.Sprintf(`reaper.hcl:5:1: reaper plugin %q does not serve edition "lite" (it serves [kube])`, name)
			if code != 1 || !strings.Contains(errs, want) {
				t.Fatalf("code %d, stderr %q, want exit 1 and %q", code, errs, want)
			}
			if lines := strings.Split(strings.TrimSpace(errs), "\n"); len(lines) != 1 {
				t.Fatalf("%d problems reported, want only the kube-only reaper:\n%s", len(lines), errs)
			}
		})
	}
}
