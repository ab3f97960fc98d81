// Package plugins_test checks what every in-tree reaper declares to the host.
package plugins_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/sdk"
)

// The host meters and audits a plugin's decision only under a label the
// plugin declared when it was launched (sdk.AllowedLabels of its Info).
// So every sdk.Label constant an in-tree reaper's code names (outside its
// tests) must be among what it declares, and the declaration must pass
// the host's launch check: a label forgotten here would turn an honest
// decision into a refusal.
func TestInTreeReapersDeclareEveryLabelTheirCodeNames(t *testing.T) {
	t.Parallel()
	values := labelValues(t)
	for dir, r := range map[string]sdk.Reaper{
		"agentlost": agentlost.New(nil), "dispatchlost": dispatchlost.New(nil), "orphanrun": orphanrun.New(nil),
		"podlost": podlost.New(nil), "warmworker": warmworker.New(nil),
	} {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			info, err := r.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := sdk.CheckDeclared(info); err != nil {
				t.Fatalf("the host would refuse to launch it: %v", err)
			}
			allowed := sdk.AllowedLabels(info)
			named := labelsNamed(t, dir)
			if len(named) == 0 {
				t.Fatal("its code names no label: the walk is broken")
			}
			for _, name := range named {
				v, ok := values[name]
				if !ok {
					t.Fatalf("sdk.%s is no label constant of sdk/labels.go", name)
				}
				if !allowed[v] {
					t.Errorf("its code names sdk.%s (%q), which it does not declare", name, v)
				}
			}
		})
	}
}

// The in-tree reapers' declared kill and provisional labels (sdk.Info)
// are, together, the sdk's built-in lists (sdk.KillLabels,
// sdk.ProvisionalLabels), which stand for a plugin that declares none.
func TestInTreeKillLabelsAreTheBuiltInLists(t *testing.T) {
	t.Parallel()
	var kill, provisional []string
	for _, r := range []sdk.Reaper{agentlost.New(nil), dispatchlost.New(nil), orphanrun.New(nil), podlost.New(nil), warmworker.New(nil)} {
		info, err := r.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		k, p := sdk.DeclaredKillLabels(info)
		kill, provisional = append(kill, k...), append(provisional, p...)
	}
	for _, c := range []struct {
		what         string
		got, builtIn []string
	}{{"kill", kill, sdk.KillLabels()}, {"provisional", provisional, sdk.ProvisionalLabels()}} {
		slices.Sort(c.got)
		want := slices.Sorted(slices.Values(c.builtIn))
		if !slices.Equal(c.got, want) {
			t.Errorf("%s labels declared %v, built in %v", c.what, c.got, want)
		}
	}
}

// labelValues maps the name of each string constant of sdk/labels.go to
// its value.
func labelValues(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "sdk", "labels.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if v, err := strconv.Unquote(lit.Value); err == nil {
						out[n.Name] = v
					}
				}
			}
		}
	}
	return out
}

// labelsNamed lists the sdk.Label* selectors in the non-test Go files of
// the plugin's directory.
func labelsNamed(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "sdk" && strings.HasPrefix(sel.Sel.Name, "Label") && !seen[sel.Sel.Name] {
				seen[sel.Sel.Name] = true
				out = append(out, sel.Sel.Name)
			}
			return true
		})
	}
	return out
}
