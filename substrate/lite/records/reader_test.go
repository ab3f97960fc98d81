package records

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/sdk"
)

// One Reader reading many records answers each as Dir's own reads do: a
// long record after short ones, a garbled or missing one between, and no
// record read earlier changes when a later one is read into the same buffer.
func TestReaderReadsEachRecordAsDirDoes(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "rec"))
	if err != nil {
		t.Fatal(err)
	}
	var groups []GroupRecord
	for i, run := range []string{"r", strings.Repeat("long_run/", 40), "r2", strings.Repeat("x", 300)} {
		g := sampleGroup()
		g.Attempt.RunID = run
		g.PGID += i
		g.Boot = []string{"boot-a", "boot-a", "boot_b", ""}[i]
		if err := d.WriteGroup(g); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
	}
	garbled := sampleGroup()
	garbled.Attempt.RunID = "garbled"
	if err := os.WriteFile(d.GroupPath(garbled.Attempt), []byte("not a record\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := sampleGroup().Attempt
	missing.RunID = "missing"

	r := d.Reader()
	var got []GroupRecord
	for _, g := range groups {
		rec, err := r.ReadGroup(g.Attempt)
		if err != nil {
			t.Fatalf("ReadGroup(%s): %v", g.Attempt, err)
		}
		got = append(got, rec)
		if _, err := r.ReadGroup(garbled.Attempt); !errors.Is(err, ErrGarbled) {
			t.Fatalf("garbled record: %v", err)
		}
		_, err = r.ReadGroup(missing)
		if _, derr := d.ReadGroup(missing); !errors.Is(err, fs.ErrNotExist) || err.Error() != derr.Error() {
			t.Fatalf("missing record: %v, want %v", err, derr)
		}
	}
	for i := range groups {
		if got[i] != groups[i] {
			t.Errorf("record %d = %+v, want %+v", i, got[i], groups[i])
		}
	}
	a := sampleAgent()
	if err := d.WriteAgent(a); err != nil {
		t.Fatal(err)
	}
	if rec, err := r.ReadAgent(a.Attempt); err != nil || rec != a {
		t.Fatalf("ReadAgent = %+v, %v; want %+v", rec, err, a)
	}
}

// Name is the escaped ids and the try and epoch, or for ids too long a hash
// of them, as every record written so far is named.
func TestNameFormat(t *testing.T) {
	long := strings.Repeat("x", 300)
	h := sha256.Sum256([]byte(long + "\x00" + "t_1"))
	for a, want := range map[sdk.Attempt]string{
		{RunID: "run 1", TaskID: "load_a", Try: 2, Epoch: 3}:   "run%201__load%5Fa__2__3",
		{RunID: "r", TaskID: "t", Try: -1, Epoch: 0}:           "r__t__-1__0",
		{RunID: long, TaskID: "t_1", Try: 1, Epoch: 12}:        "h" + hex.EncodeToString(h[:16]) + "__1__12",
		{RunID: strings.Repeat("y", 190), TaskID: "t", Try: 1}: strings.Repeat("y", 190) + "__t__1__0",
	} {
		if got := Name(a); got != want {
			t.Errorf("Name(%v) = %q, want %q", a, got, want)
		}
	}
	// The longest escaped name kept is maxName bytes; one more is hashed.
	for _, n := range []int{maxName - len("__t__1__0"), maxName - len("__t__1__0") + 1} {
		a := sdk.Attempt{RunID: strings.Repeat("z", n), TaskID: "t", Try: 1}
		hashed := strings.HasPrefix(Name(a), "h") && len(Name(a)) == 1+32+len("__1__0")
		if hashed != (n+len("__t__1__0") > maxName) {
			t.Errorf("run id of %d bytes: name %q", n, Name(a))
		}
	}
}

// isEscapeOf(b, s) is exactly Escape(s) == string(b).
func FuzzIsEscapeOf(f *testing.F) {
	for _, s := range []string{"", "a", "load_a", "run 1/α", "%41", "a%5F"} {
		f.Add(s, []byte(Escape(s)))
		f.Add(s, []byte(s))
	}
	f.Add("_", []byte("%5f"))
	f.Add("ab", []byte("a"))
	f.Fuzz(func(t *testing.T, s string, b []byte) {
		if got, want := isEscapeOf(b, s), Escape(s) == string(b); got != want {
			t.Fatalf("isEscapeOf(%q, %q) = %v, want %v", b, s, got, want)
		}
	})
}

// A parse told what to expect answers exactly as one told nothing.
func checkLikely(t *testing.T, data []byte, likes ...likely) {
	t.Helper()
	ga, gerrA := ParseAgent(data)
	gg, gerrG := ParseGroup(data)
	for _, like := range likes {
		a, errA := parseAgent(data, like)
		g, errG := parseGroup(data, like)
		if a != ga || errString(errA) != errString(gerrA) || g != gg || errString(errG) != errString(gerrG) {
			t.Fatalf("parse expecting %+v differs: %+v, %v / %+v, %v; want %+v, %v / %+v, %v",
				like, a, errA, g, errG, ga, gerrA, gg, gerrG)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestParseExpectingAnswersAsParse(t *testing.T) {
	g := sampleGroup()
	other := g.Attempt
	other.TaskID += "x"
	for _, data := range [][]byte{sampleAgent().Marshal(), g.Marshal(), []byte("junk\n")} {
		checkLikely(t, data,
			likely{},
			likely{attempt: g.Attempt, boot: g.Boot},
			likely{attempt: other, boot: "other"},
			likely{attempt: sdk.Attempt{RunID: "run 1", TaskID: "load"}, boot: strconv.Itoa(1)})
	}
}
