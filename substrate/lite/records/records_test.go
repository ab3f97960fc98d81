package records

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

func sampleAgent() AgentRecord {
	return AgentRecord{
		Attempt: sdk.Attempt{RunID: "run 1/α", TaskID: "load_a", Try: 2, Epoch: 3},
		PID:     4242, Start: 987654, Boot: "177cea5b-c768",
	}
}

func sampleGroup() GroupRecord {
	return GroupRecord{
		Attempt: sdk.Attempt{RunID: "run 1/α", TaskID: "load_a", Try: 2, Epoch: 3},
		PGID:    4343, AgentPID: 4242, AgentStart: 987654, LeaderStart: 987700, Boot: "177cea5b-c768",
	}
}

func TestRecordRoundTrip(t *testing.T) {
	a := sampleAgent()
	got, err := ParseAgent(a.Marshal())
	if err != nil || got != a {
		t.Fatalf("agent round trip: got %+v, %v; want %+v", got, err, a)
	}
	g := sampleGroup()
	gotG, err := ParseGroup(g.Marshal())
	if err != nil || gotG != g {
		t.Fatalf("group round trip: got %+v, %v; want %+v", gotG, err, g)
	}
	if _, err := ParseGroup(a.Marshal()); !errors.Is(err, ErrGarbled) {
		t.Fatalf("an agent record parsed as a group record: %v", err)
	}
}

func TestTruncatedRecordIsGarbled(t *testing.T) {
	for _, data := range [][]byte{sampleAgent().Marshal(), sampleGroup().Marshal()} {
		for n := 0; n < len(data); n++ {
			_, errA := ParseAgent(data[:n])
			_, errG := ParseGroup(data[:n])
			if !errors.Is(errA, ErrGarbled) || !errors.Is(errG, ErrGarbled) {
				t.Fatalf("record truncated to %d bytes was accepted: %v / %v", n, errA, errG)
			}
		}
	}
}

func TestAlteredRecordIsGarbled(t *testing.T) {
	data := sampleGroup().Marshal()
	for i := range data {
		alt := bytes.Clone(data)
		alt[i] ^= 0x01
		if _, err := ParseGroup(alt); !errors.Is(err, ErrGarbled) {
			t.Fatalf("record with byte %d flipped was accepted", i)
		}
	}
}

func TestProcessIDOfOneOrLessIsGarbled(t *testing.T) {
	for _, pid := range []int{1, 0, -1, -4242} {
		a := sampleAgent()
		a.PID = pid
		if _, err := ParseAgent(a.Marshal()); !errors.Is(err, ErrGarbled) {
			t.Errorf("agent pid %d accepted: %v", pid, err)
		}
		g := sampleGroup()
		g.PGID = pid
		if _, err := ParseGroup(g.Marshal()); !errors.Is(err, ErrGarbled) {
			t.Errorf("pgid %d accepted: %v", pid, err)
		}
		g = sampleGroup()
		g.AgentPID = pid
		if _, err := ParseGroup(g.Marshal()); !errors.Is(err, ErrGarbled) {
			t.Errorf("group agent pid %d accepted: %v", pid, err)
		}
	}
}

func TestEscape(t *testing.T) {
	for _, s := range []string{"", "plain-id.1", "load_a", "a__b", "100%", "new\nline", "é", "x=y", "../etc"} {
		e := Escape(s)
		if strings.Contains(e, "__") || strings.ContainsAny(e, "/\n=_") {
			t.Errorf("Escape(%q) = %q holds a separator", s, e)
		}
		back, err := Unescape(e)
		if err != nil || back != s {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", s, back, err)
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "%41", "a_b", "%e9"} {
		if _, err := Unescape(bad); err == nil {
			t.Errorf("Unescape(%q) accepted a non-canonical escape", bad)
		}
	}
}

func TestNamesAreDistinctAndShort(t *testing.T) {
	attempts := []sdk.Attempt{
		{RunID: "r", TaskID: "load_a", Try: 1},
		{RunID: "r", TaskID: "load-a", Try: 1},
		{RunID: "r__load", TaskID: "a", Try: 1},
		{RunID: "r", TaskID: "load__a", Try: 1},
		{RunID: "r", TaskID: "load_a", Try: 1, Epoch: 1},
		{RunID: "r", TaskID: "load_a", Try: 2},
		{RunID: strings.Repeat("x", 300), TaskID: "t", Try: 1},
		{RunID: strings.Repeat("x", 300), TaskID: "u", Try: 1},
	}
	seen := map[string]sdk.Attempt{}
	for _, a := range attempts {
		n := Name(a)
		if len(n)+len(GroupExt) > 255 {
			t.Errorf("name of %v is %d bytes", a, len(n))
		}
		if strings.ContainsRune(n, '/') {
			t.Errorf("name %q holds a slash", n)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("%v and %v share the name %q", prev, a, n)
		}
		seen[n] = a
	}
}

func TestWriteReadRemove(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "rec"))
	if err != nil {
		t.Fatal(err)
	}
	a := sampleAgent()
	if err := d.WriteAgent(a); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAgent(a); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a second record for the same attempt was not refused: %v", err)
	}
	got, err := d.ReadAgent(a.Attempt)
	if err != nil || got != a {
		t.Fatalf("ReadAgent = %+v, %v", got, err)
	}
	g := sampleGroup()
	if err := d.WriteGroup(g); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadGroup(g.Attempt); err != nil {
		t.Fatal(err)
	}
	other := a.Attempt
	other.Epoch++
	if _, err := d.ReadAgent(other); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("another epoch's record: %v", err)
	}
	// A record copied under another attempt's name names the wrong attempt.
	data, _ := os.ReadFile(d.AgentPath(a.Attempt))
	if err := os.WriteFile(d.AgentPath(other), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAgent(other); !errors.Is(err, ErrGarbled) {
		t.Fatalf("record naming another attempt: %v", err)
	}
	if err := d.Remove(a.Attempt); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadGroup(g.Attempt); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}
	entries, _ := os.ReadDir(d.Path())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestOversizedOrSpecialRecordIsGarbled(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "rec"))
	if err != nil {
		t.Fatal(err)
	}
	a := sampleAgent().Attempt
	if err := os.WriteFile(d.AgentPath(a), bytes.Repeat([]byte("x"), MaxRecordSize+10), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAgent(a); !errors.Is(err, ErrGarbled) {
		t.Fatalf("oversized record: %v", err)
	}
	if err := os.Symlink("/etc/passwd", d.GroupPath(a)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadGroup(a); !errors.Is(err, ErrGarbled) {
		t.Fatalf("symlinked record: %v", err)
	}
}

func TestOpenCreatesPrivateDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "rec")
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Created {
		t.Error("Created is false for a new directory")
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v, %v; want 0700", st.Mode(), err)
	}
	d, err = Open(path)
	if err != nil || d.Created {
		t.Fatalf("reopening: created=%v err=%v", d != nil && d.Created, err)
	}
}

func TestDefaultPath(t *testing.T) {
	t.Setenv("TMPDIR", "/some/tmp")
	want := filepath.Join("/some/tmp", DirPrefix) // + uid
	if p := DefaultPath(); !strings.HasPrefix(p, want) {
		t.Fatalf("DefaultPath() = %q, want prefix %q", p, want)
	}
}

func TestOpenRefuses(t *testing.T) {
	base := t.TempDir()
	cases := []struct {
		name   string
		setup  func(path string) error
		reason string
	}{
		{"Symlink", func(p string) error {
			real := p + ".real"
			if err := os.Mkdir(real, 0o700); err != nil {
				return err
			}
			return os.Symlink(real, p)
		}, "is a symlink"},
		{"OwnedByAnotherUser", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chown(p, 65534, 65534)
		}, "owned by uid 65534"},
		{"WorldWritable", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o777)
		}, "writable by group or others (mode 0777)"},
		{"GroupWritable", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chmod(p, 0o770)
		}, "writable by group or others (mode 0770)"},
		{"NotADirectory", func(p string) error { return os.WriteFile(p, nil, 0o600) }, "not a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Only this case needs root (to hand a directory to another
			// user); the others run as any user.
			if tc.name == "OwnedByAnotherUser" && os.Geteuid() != 0 {
				t.Skip("needs root to hand a directory to another user")
			}
			path := filepath.Join(base, tc.name)
			if err := tc.setup(path); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not name the path and %q", err, tc.reason)
			}
		})
	}
}
