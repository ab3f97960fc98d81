package board

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/board/migrations"
	"github.com/dexaflow/reaper/sdk"
)

// A migration is immutable SQL, so its text cannot be built from Go. These
// tests hold the migrations' copies of the live-instance rule to the Go
// definition (sdk.LiveStates, sdk.SettledStates): a change to the rule in Go
// that the schema does not follow fails here.

// indexWhere returns the WHERE clause of the named CREATE INDEX in the
// migration file, whitespace collapsed.
func indexWhere(t *testing.T, file, index string) string {
	t.Helper()
	body, err := fs.ReadFile(migrations.FS, file)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?s)CREATE INDEX ` + index + `\b.*?\bWHERE\s+(.*?);`)
	m := re.FindSubmatch(body)
	if m == nil {
		t.Fatalf("%s: no index %s with a WHERE clause", file, index)
	}
	return flat(string(m[1]))
}

func flat(s string) string { return strings.Join(strings.Fields(s), " ") }

// newestDefinition returns the last migration file (in version order) that
// creates the named index.
func newestDefinition(t *testing.T, index string) string {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	newest := ""
	for _, f := range files { // fs.Glob returns names in lexical order: version order
		body, err := fs.ReadFile(migrations.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`CREATE INDEX ` + index + `\b`).Match(body) {
			newest = f
		}
	}
	if newest == "" {
		t.Fatalf("no migration creates %s", index)
	}
	return newest
}

func TestOpenSettledIndexIsTheComplementOfLive(t *testing.T) {
	const index = "task_instances_open_settled_idx"
	file := newestDefinition(t, index)
	got := indexWhere(t, file, index)
	if want := flat(openSettledWhere("")); got != want {
		t.Fatalf("%s's index no longer matches the live rule:\nmigration %s\ngo        %s", file, got, want)
	}
	// The complement is exact: every state is live or settled, never both.
	live, settled := sdk.LiveStates(), sdk.SettledStates()
	if len(live)+len(settled) != len(sdk.TaskStates()) {
		t.Fatalf("live %v and settled %v do not partition %v", live, settled, sdk.TaskStates())
	}
}

// The candidate indexes hold every live state, but for the running rows of
// task_instances_queued_at_idx (migration 024): no listing reads running
// attempts by queued_at from it (the warm pool's has its own index, 023),
// and a heartbeat would otherwise write an entry in it.
func TestCandidateIndexesCoverTheLiveStates(t *testing.T) {
	live := sdk.LiveStates()
	var notRunning []string
	for _, st := range live {
		if st != sdk.StateRunning {
			notRunning = append(notRunning, st)
		}
	}
	for idx, states := range map[string][]string{
		"task_instances_queued_at_idx":  notRunning,
		"task_instances_running_at_idx": live,
		"task_instances_heartbeat_idx":  live,
	} {
		file := newestDefinition(t, idx)
		if got, want := indexWhere(t, file, idx), flat("state IN ("+sqlList(states)+")"); got != want {
			t.Errorf("%s (%s) covers %s, want %s", idx, file, got, want)
		}
	}
}

// The SQL of the live rule is built from the same lists.
func TestLiveSQLIsBuiltFromTheStates(t *testing.T) {
	for _, st := range sdk.LiveStates() {
		if !strings.Contains(liveTI("$2"), "'"+st+"'") {
			t.Errorf("liveTI does not name %s", st)
		}
	}
	for _, st := range sdk.SettledStates() {
		if strings.Contains(liveTI("$2"), "ti.state IN ('"+st+"'") || strings.Contains(liveTI("$2"), ", '"+st+"'") {
			t.Errorf("liveTI names the settled state %s among the live ones", st)
		}
	}
}
