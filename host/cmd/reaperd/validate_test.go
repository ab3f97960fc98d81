package main

import (
	"bytes"
	"context"
	"fmt"
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
		{"ValueThePluginRefuses", "reaper \"echo\" {\n  mode = \"sideways\"\n}\n", `reaper.hcl:4:1: reaper plugin "echo" refused its configuration`},
		{"MissingPluginBinary", "reaper \"nosuch\" {}\n", `reaper plugin "nosuch"`},
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
