// Package plugins_test checks what every in-tree reaper declares to the
// host: each plugin folder here is found, built and launched over the
// plugin protocol, so a new plugin is checked without a line of this file.
package plugins_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/plugin"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// reapers are the in-tree reapers this package's directory holds, found by
// their folders (each with its binary's main in cmd/reaper-<folder>), and
// binDir where TestMain built those binaries.
var (
	reapers []string
	binDir  string
)

func TestMain(m *testing.M) {
	var err error
	if reapers, err = discover("."); err != nil {
		fmt.Fprintf(os.Stderr, "plugins: %v\n", err)
		os.Exit(2)
	}
	pkgs := make([]string, len(reapers))
	for i, r := range reapers {
		pkgs[i] = "./" + r + "/cmd/reaper-" + r
	}
	os.Exit(testbin.Main(m, "plugins", pkgs, func(m *testing.M, bin string) int {
		binDir = bin
		return m.Run()
	}))
}

// discover lists the folders of dir that hold a reaper plugin: a
// cmd/reaper-<folder> main beside its code.
func discover(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the plugins' folder: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "cmd", "reaper-"+e.Name(), "main.go")); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no plugin found in %s: the walk is broken", dir)
	}
	return out, nil
}

// infoOf launches the reaper's built binary over the plugin protocol, as
// the host does, and returns what it declares.
func infoOf(t *testing.T, name string) sdk.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake(),
		VersionedPlugins: plugin.PluginSets(),
		Cmd:              exec.Command(filepath.Join(binDir, "reaper-"+name)),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("launching reaper-%s: %v", name, err)
	}
	raw, err := rpc.Dispense(plugin.PluginReaper)
	if err != nil {
		t.Fatalf("dispensing reaper-%s: %v", name, err)
	}
	base, ok := raw.(sdk.Plugin)
	if !ok {
		t.Fatalf("reaper-%s dispensed %T, not a plugin", name, raw)
	}
	info, err := base.Info(ctx)
	if err != nil {
		t.Fatalf("the Info of reaper-%s: %v", name, err)
	}
	return info
}

// The host meters and audits a plugin's decision only under a label the
// plugin declared when it was launched (sdk.AllowedLabels of its Info).
// So every sdk.Label constant an in-tree reaper's code names (outside its
// tests) must be among what it declares, and the declaration must pass
// the host's launch check: a label forgotten here would turn an honest
// decision into a refusal.
func TestInTreeReapersDeclareEveryLabelTheirCodeNames(t *testing.T) {
	t.Parallel()
	values := labelValues(t)
	for _, dir := range reapers {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			info := infoOf(t, dir)
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
	for _, r := range reapers {
		info := infoOf(t, r)
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
