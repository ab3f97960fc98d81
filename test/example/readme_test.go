package example_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestReadmeSnippetsAreTheExample: every Go snippet of the README's
// plugin-author walk is an excerpt of examples/parked, word for word, so
// each one compiles whenever the example does (make test builds and tests
// it) and the walk cannot drift from the code it teaches.
func TestReadmeSnippetsAreTheExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "## Writing a reaper plugin")
	if start < 0 {
		t.Fatal("README has no section \"Writing a reaper plugin\"")
	}
	section = section[start+2:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}

	var source strings.Builder
	err = filepath.WalkDir(exampleModule, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".go" {
			return err
		}
		b, err := os.ReadFile(path)
		source.Write(b)
		source.WriteString("\n")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	snippets := 0
	for rest := section; ; {
		i := strings.Index(rest, "```go\n")
		if i < 0 {
			break
		}
		rest = rest[i+len("```go\n"):]
		j := strings.Index(rest, "```")
		if j < 0 {
			t.Fatal("an unterminated Go snippet")
		}
		snippet := rest[:j]
		rest = rest[j+3:]
		snippets++
		if !strings.Contains(source.String(), snippet) {
			t.Errorf("README snippet %d is not an excerpt of %s:\n%s", snippets, exampleModule, snippet)
		}
	}
	if snippets < 5 {
		t.Fatalf("found %d Go snippets in the walk, want the example's config, Reaper, Reap, judge, mark, main and test", snippets)
	}
}

// TestReadmeNamesEveryMakeTarget: the README names every target of the
// Makefile (as "make TARGET"), and every "make X" it names is a target, so
// the documented commands and the Makefile cannot drift apart.
func TestReadmeNamesEveryMakeTarget(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bmake (?:-s )?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(readme), -1) {
		named[m[1]] = true
	}
	if len(targets) == 0 {
		t.Fatal("no target found in the Makefile")
	}
	var missing, unknown []string
	for tg := range targets {
		if !named[tg] {
			missing = append(missing, tg)
		}
	}
	for n := range named {
		if !targets[n] {
			unknown = append(unknown, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	if len(missing) > 0 {
		t.Errorf("Makefile targets the README never names: %v", missing)
	}
	if len(unknown) > 0 {
		t.Errorf("the README names make targets the Makefile lacks: %v", unknown)
	}
}
