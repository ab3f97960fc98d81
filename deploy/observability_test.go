package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dexaflow/reaper/host/metrics"
	"github.com/dexaflow/reaper/sdk"
)

const (
	dashboardPath = "grafana/reaper.json"
	rulesPath     = "prometheus/reaper-rules.yaml"
	rulesTestPath = "prometheus/reaper-rules.test.yaml"
	operatePath   = "../docs/operate.md"
)

// registeredMetrics gathers the names of the series reaperd exports: the host
// registry with every collector made to report once (a vector with no child
// is not gathered). A histogram exports _bucket, _sum and _count.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.Decision(sdk.Decision{Label: sdk.LabelAgentLost})
	m.Override(sdk.LabelAgentLost, 1)
	m.Phase("reap", time.Second, true)
	m.Pass("agentlost", time.Second)
	m.Leader(true, 1)
	m.PluginRestart("agentlost")
	m.Cycle(time.Unix(1700000000, 0))
	m.AttemptAPICall("exchange", "bootstrap_spent", time.Millisecond)
	m.ShadowVerdict("agentlost", sdk.LabelAgentLost, sdk.VerdictWouldHaveKilledLiveWork)
	m.Pools(map[string]int{"db": 4}, "default_pool", nil)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering the host's registry: %v", err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
		switch f.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		case "SUMMARY":
			names[f.GetName()+"_sum"], names[f.GetName()+"_count"] = true, true
		}
	}
	return names
}

var (
	promString    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promRange     = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promOffset    = regexp.MustCompile(`\boffset\s+\S+`)
	promIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "inf": true, "nan": true}
	labelValues   = regexp.MustCompile(`^label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)`)
	decisionMatch = regexp.MustCompile(`decision_type\s*(=~|=)\s*"([^"]*)"`)
)

// metricNames returns the metric names a PromQL expression selects: what is
// left once strings, label matchers, ranges, grouping lists and offsets are
// removed, minus function calls and keywords.
func metricNames(expr string) []string {
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		return []string{m[1]} // a Grafana variable query: label_values(metric, label)
	}
	s := promMatchers.ReplaceAllString(expr, " ")
	s = promString.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = promOffset.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(s, -1) {
		name := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " \t\n")
		if m[1] != "" || promKeywords[strings.ToLower(name)] {
			continue // a function or an aggregation, or a keyword
		}
		names = append(names, name)
	}
	return names
}

// dashboardQueries walks the dashboard's panels (rows' nested ones too) and
// variables, returning every PromQL expression with where it is.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(readFile(t, dashboardPath), &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	qs := map[string]string{}
	var walk func(raw []json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p struct {
				Title   string            `json:"title"`
				Panels  []json.RawMessage `json:"panels"`
				Targets []struct {
					RefID string `json:"refId"`
					Expr  string `json:"expr"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: a panel: %v", dashboardPath, err)
			}
			for _, tg := range p.Targets {
				qs["panel "+p.Title+" "+tg.RefID] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: variable %s: %v", dashboardPath, v.Name, err)
		}
		qs["variable "+v.Name] = q.Query
	}
	return qs
}

// ruleExprs reads the alert names and expressions of the rules file: each
// "- alert: NAME" and its "expr:" (one line, or a block scalar).
func ruleExprs(t *testing.T) (names []string, exprs map[string]string) {
	t.Helper()
	exprs = map[string]string{}
	lines := strings.Split(string(readFile(t, rulesPath)), "\n")
	current := ""
	for i := 0; i < len(lines); i++ {
		trim := strings.TrimSpace(lines[i])
		if v, ok := strings.CutPrefix(trim, "- alert: "); ok {
			current = v
			names = append(names, v)
			continue
		}
		v, ok := strings.CutPrefix(trim, "expr: ")
		if !ok || current == "" {
			continue
		}
		if v != "|" && v != ">" {
			exprs[current] = v
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var b strings.Builder
		for i+1 < len(lines) {
			next := lines[i+1]
			if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
				break
			}
			b.WriteString(next + "\n")
			i++
		}
		exprs[current] = b.String()
	}
	if len(names) == 0 {
		t.Fatalf("%s: no alerts found", rulesPath)
	}
	return names, exprs
}

// checkQueries fails on a query that selects a metric not in allowed, or
// matches a decision label reaperd does not have.
func checkQueries(t *testing.T, file string, queries map[string]string, allowed map[string]bool) {
	t.Helper()
	known := map[string]bool{}
	for _, l := range sdk.Labels() {
		known[l] = true
	}
	where := make([]string, 0, len(queries))
	for w := range queries {
		where = append(where, w)
	}
	sort.Strings(where)
	for _, w := range where {
		q := queries[w]
		names := metricNames(q)
		if len(names) == 0 {
			t.Errorf("%s: %s selects no metric: %q", file, w, q)
		}
		for _, n := range names {
			if !allowed[n] {
				t.Errorf("%s: %s uses %s, which reaperd does not export", file, w, n)
			}
		}
		for _, m := range decisionMatch.FindAllStringSubmatch(q, -1) {
			for _, alt := range strings.Split(m[2], "|") {
				re, err := regexp.Compile("^(?:" + alt + ")$")
				if err != nil {
					t.Errorf("%s: %s: decision_type %q: %v", file, w, alt, err)
					continue
				}
				hit := false
				for l := range known {
					hit = hit || re.MatchString(l)
				}
				if !hit || (m[1] == "=" && !known[alt]) {
					t.Errorf("%s: %s matches decision_type %q, which is no decision label (sdk/labels.go)", file, w, alt)
				}
			}
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	reg := registeredMetrics(t)
	queries := dashboardQueries(t)

	t.Run("QueriesUseOnlyRegisteredMetrics", func(t *testing.T) {
		checkQueries(t, dashboardPath, queries, reg)
	})

	t.Run("ShowsEveryMetricTheHostExports", func(t *testing.T) {
		used := map[string]bool{}
		for _, q := range queries {
			for _, n := range metricNames(q) {
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			}
		}
		for n := range reg {
			own := strings.HasPrefix(n, "reaper_") || strings.HasPrefix(n, "dexaflow_")
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
			if own && !used[base] {
				t.Errorf("%s is exported but on no panel", n)
			}
		}
	})

	t.Run("TheMetricCheckCatchesAnUnknownMetric", func(t *testing.T) {
		got := metricNames(`histogram_quantile(0.99, sum by (le, phase) (rate(reaper_phase_seconds_bucket{job=~"$job"}[$__rate_interval]))) / on (x) reaper_leader offset 5m`)
		if strings.Join(got, " ") != "reaper_phase_seconds_bucket reaper_leader" || reg[got[0]] {
			t.Errorf("metricNames = %v", got)
		}
	})
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: it ships with Debian's prometheus package " +
			"(apt-get install --no-install-recommends prometheus; .ci/run installs it)")
	}
	return p
}

func TestAlertRules(t *testing.T) {
	tool := promtool(t)
	names, exprs := ruleExprs(t)
	run := func(t *testing.T, dir string, args ...string) (string, error) {
		cmd := exec.Command(tool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("CheckedByPromtool", func(t *testing.T) {
		if out, err := run(t, ".", "check", "rules", rulesPath); err != nil {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
	})

	t.Run("UnitTestedByPromtool", func(t *testing.T) {
		if out, err := run(t, ".", "test", "rules", rulesTestPath); err != nil {
			t.Fatalf("promtool test rules: %v\n%s", err, out)
		}
	})

	t.Run("EveryAlertIsTestedFiringAndNotFiring", func(t *testing.T) {
		tests := string(readFile(t, rulesTestPath))
		for _, n := range names {
			quiet := regexp.MustCompile(`alertname: ` + n + `\n\s+exp_alerts: \[\]`)
			firing := regexp.MustCompile(`alertname: ` + n + `\n\s+exp_alerts:\n\s+- exp_labels:`)
			if !quiet.MatchString(tests) {
				t.Errorf("%s: no test where it does not fire", n)
			}
			if !firing.MatchString(tests) {
				t.Errorf("%s: no test where it fires", n)
			}
		}
	})

	t.Run("UnitTestsCatchABrokenRule", func(t *testing.T) {
		// Raise every threshold out of reach: the firing expectations must fail.
		dir := t.TempDir()
		src := strings.NewReplacer("> 0", "> 1e9", "> 2", "> 1e9", "== 0", "== 1e9").Replace(string(readFile(t, rulesPath)))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(rulesPath)), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(rulesTestPath)), readFile(t, rulesTestPath), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := run(t, dir, "test", "rules", filepath.Base(rulesTestPath))
		if err == nil {
			t.Fatalf("promtool test rules passed with every alert disabled:\n%s", out)
		}
		for _, n := range names {
			if !strings.Contains(out, "alertname: "+n) {
				t.Errorf("%s: its tests did not notice it can no longer fire", n)
			}
		}
	})

	t.Run("QueriesUseOnlyRegisteredMetrics", func(t *testing.T) {
		allowed := registeredMetrics(t)
		// Prometheus's own scrape health, and a blackbox probe of /monitor/health.
		allowed["up"], allowed["probe_success"] = true, true
		qs := map[string]string{}
		for n, e := range exprs {
			qs["alert "+n] = e
		}
		if len(qs) != len(names) {
			t.Fatalf("%d alerts but %d expressions read", len(names), len(qs))
		}
		checkQueries(t, rulesPath, qs, allowed)
	})

	t.Run("EveryRunbookIsASectionOfTheOperatorGuide", func(t *testing.T) {
		rules := string(readFile(t, rulesPath))
		guide := string(readFile(t, operatePath))
		anchors := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(guide, -1) {
			anchors[githubAnchor(m[1])] = true
		}
		urls := regexp.MustCompile(`runbook_url: "[^"#]*docs/operate\.md#([^"]+)"`).FindAllStringSubmatch(rules, -1)
		if len(urls) != len(names) {
			t.Errorf("%d alerts, %d runbook_url pointers into docs/operate.md", len(names), len(urls))
		}
		for _, u := range urls {
			if !anchors[u[1]] {
				t.Errorf("runbook #%s is no heading of docs/operate.md", u[1])
			}
		}
	})
}

// githubAnchor is the fragment GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}
