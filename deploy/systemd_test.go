// Package deploy_test checks the deployment files under deploy/: the systemd
// unit for Lite, the example configurations, the Grafana dashboard and the
// Prometheus rules. (The container image has its own module, tools/image.)
package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	unitPath    = "systemd/reaperd.service"
	envPath     = "systemd/reaperd.env"
	liteHCLPath = "systemd/reaper.hcl"
)

// unit is a parsed unit file: section -> key -> values in order.
type unit map[string]map[string][]string

// get is the last value of a key (systemd's rule for most keys), "" if unset.
func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// unitKeys are the keys this check knows, per section. It stands in for
// systemd's own parser where systemd-analyze is missing, so it is strict:
// a key outside this list is an error (add it here when the unit needs it).
var unitKeys = map[string][]string{
	"Unit": {"Description", "Documentation", "After", "Before", "Wants", "Requires", "StartLimitIntervalSec", "StartLimitBurst"},
	"Service": {"Type", "User", "Group", "EnvironmentFile", "Environment", "ExecStart", "ExecStartPre", "ExecReload",
		"Restart", "RestartSec", "KillMode", "KillSignal", "TimeoutStopSec", "TimeoutStartSec",
		"RuntimeDirectory", "RuntimeDirectoryMode", "RuntimeDirectoryPreserve", "StateDirectory", "StateDirectoryMode",
		"LogsDirectory", "LogsDirectoryMode", "UMask", "NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities",
		"ProtectSystem", "ProtectHome", "PrivateDevices", "PrivateTmp", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname", "RestrictSUIDSGID",
		"RestrictRealtime", "RestrictNamespaces", "LockPersonality", "SystemCallArchitectures",
		"RestrictAddressFamilies", "SystemCallFilter", "SystemCallErrorNumber", "ReadWritePaths", "ReadOnlyPaths",
		"LimitNOFILE"},
	"Install": {"WantedBy"},
}

// booleanKeys take a systemd boolean; the others are free text here.
var booleanKeys = map[string]bool{
	"NoNewPrivileges": true, "PrivateDevices": true, "PrivateTmp": true, "ProtectKernelTunables": true,
	"ProtectKernelModules": true, "ProtectKernelLogs": true, "ProtectControlGroups": true, "ProtectClock": true,
	"ProtectHostname": true, "RestrictSUIDSGID": true, "RestrictRealtime": true, "LockPersonality": true,
}

var (
	sectionLine = regexp.MustCompile(`^\[([A-Za-z]+)\]$`)
	keyLine     = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9]*)=(.*)$`)
	booleans    = regexp.MustCompile(`^(yes|no|true|false|on|off|1|0)$`)
)

// parseUnit reads a unit file strictly: sections and keys it does not know,
// lines that are neither, continuation lines and non-boolean booleans are
// errors, each named by line.
func parseUnit(src []byte) (unit, error) {
	known := map[string]map[string]bool{}
	for s, keys := range unitKeys {
		known[s] = map[string]bool{}
		for _, k := range keys {
			known[s][k] = true
		}
	}
	u := unit{}
	section := ""
	var errs []string
	sc := bufio.NewScanner(bytes.NewReader(src))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			errs = append(errs, fmt.Sprintf("line %d: continuation lines are not used in this unit", n))
			continue
		}
		if m := sectionLine.FindStringSubmatch(line); m != nil {
			section = m[1]
			if known[section] == nil {
				errs = append(errs, fmt.Sprintf("line %d: unknown section [%s]", n, section))
			}
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		switch {
		case m == nil:
			errs = append(errs, fmt.Sprintf("line %d: not a key=value line: %q", n, line))
		case section == "":
			errs = append(errs, fmt.Sprintf("line %d: %s outside a section", n, m[1]))
		case !known[section][m[1]]:
			errs = append(errs, fmt.Sprintf("line %d: unknown key %s in [%s]", n, m[1], section))
		case booleanKeys[m[1]] && !booleans.MatchString(m[2]):
			errs = append(errs, fmt.Sprintf("line %d: %s=%s is not a boolean", n, m[1], m[2]))
		default:
			u[section][m[1]] = append(u[section][m[1]], m[2])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, s := range []string{"Unit", "Service", "Install"} {
		if u[s] == nil {
			errs = append(errs, fmt.Sprintf("no [%s] section", s))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return u, nil
}

// systemdVerify runs systemd-analyze verify on the unit's text, with the
// executable it names replaced by one that exists (verify checks it). Any
// message counts as a failure: verify exits 0 on an unknown key or an
// unparsable value, it only warns. ok is false when systemd-analyze is not
// installed.
func systemdVerify(t *testing.T, src []byte) (out string, ok bool, err error) {
	t.Helper()
	tool, lerr := exec.LookPath("systemd-analyze")
	if lerr != nil {
		return "", false, nil
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "reaperd")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "reaperd.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(src, []byte("/usr/local/bin/reaperd"), []byte(exe)), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := exec.Command(tool, "verify", path).CombinedOutput()
	out = strings.TrimSpace(string(b))
	if err == nil && out != "" {
		err = fmt.Errorf("systemd-analyze verify warned")
	}
	return out, true, err
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSystemdUnit(t *testing.T) {
	src := readFile(t, unitPath)
	u, err := parseUnit(src)
	if err != nil {
		t.Fatalf("%s:\n%v", unitPath, err)
	}
	svc := func(key string) string { return u.get("Service", key) }

	t.Run("VerifiedBySystemd", func(t *testing.T) {
		out, ok, err := systemdVerify(t, src)
		if !ok {
			t.Log("systemd-analyze is not available: the unit was checked by this test's own parser only")
			return
		}
		if err != nil {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
	})

	t.Run("MalformedUnitIsRefused", func(t *testing.T) {
		// Each mutation rewrites a line that starts with old (not a comment).
		line := func(old, new string) []byte {
			return bytes.Replace(src, []byte("\n"+old), []byte("\n"+new), 1)
		}
		for name, bad := range map[string][]byte{
			"MisspelledKey":  line("KillMode=process", "KillMod=process"),
			"BadBoolean":     line("NoNewPrivileges=yes", "NoNewPrivileges=perhaps"),
			"NotAKeyLine":    line("Restart=on-failure", "Restart on-failure"),
			"UnknownSection": line("[Install]", "[Instal]"),
		} {
			if bytes.Equal(bad, src) {
				t.Fatalf("%s: the mutation did not apply", name)
			}
			if _, err := parseUnit(bad); err == nil {
				t.Errorf("%s: the parser accepted it", name)
			}
			if out, ok, err := systemdVerify(t, bad); ok && err == nil {
				t.Errorf("%s: systemd-analyze verify accepted it: %q", name, out)
			}
		}
	})

	t.Run("RestartsOnFailure", func(t *testing.T) {
		if svc("Restart") != "on-failure" {
			t.Errorf("Restart=%s, want on-failure", svc("Restart"))
		}
		if got := svc("ExecStart"); got != "/usr/local/bin/reaperd run -config /etc/reaper/reaper.hcl" {
			t.Errorf("ExecStart=%s", got)
		}
	})

	t.Run("RestartNeverKillsTheAgents", func(t *testing.T) {
		// control-group (the default) and mixed would end every agent and
		// task in the unit's cgroup on each restart.
		if svc("KillMode") != "process" {
			t.Errorf("KillMode=%s, want process", svc("KillMode"))
		}
	})

	t.Run("RecordDirectorySurvivesRestarts", func(t *testing.T) {
		rt := svc("RuntimeDirectory")
		if rt == "" || svc("RuntimeDirectoryPreserve") != "yes" {
			t.Fatalf("RuntimeDirectory=%q RuntimeDirectoryPreserve=%q: the runtime directory must be kept across stops", rt, svc("RuntimeDirectoryPreserve"))
		}
		if m := svc("RuntimeDirectoryMode"); m != "0700" {
			t.Errorf("RuntimeDirectoryMode=%s: the record directory's parent should be the user's alone", m)
		}
		tmpdir := ""
		for _, e := range u["Service"]["Environment"] {
			if v, ok := strings.CutPrefix(e, "TMPDIR="); ok {
				tmpdir = v
			}
		}
		if tmpdir != "/run/"+rt {
			t.Errorf("TMPDIR=%q, want the preserved runtime directory /run/%s", tmpdir, rt)
		}
		if b, _ := parseBool(svc("PrivateTmp")); b {
			t.Error("PrivateTmp=yes: systemd removes the private /tmp when the unit stops, under the tasks of live agents")
		}
		for _, line := range strings.Split(string(readFile(t, envPath)), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "TMPDIR=") {
				t.Errorf("%s sets TMPDIR, overriding the unit's", envPath)
			}
		}
		if !regexp.MustCompile(`(?m)^\s*record_dir\s*=\s*""`).Match(readFile(t, liteHCLPath)) {
			t.Errorf("%s: record_dir should be left to TMPDIR", liteHCLPath)
		}
	})

	t.Run("HardenedYetSignalsItsOwnAgents", func(t *testing.T) {
		if user := svc("User"); user == "" || user == "root" || user == "0" {
			t.Errorf("User=%q: run as an unprivileged user", user)
		}
		want := map[string]string{
			"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateDevices": "yes",
			"CapabilityBoundingSet": "", "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes",
			"RestrictSUIDSGID": "yes",
		}
		for k, v := range want {
			if got, set := u["Service"][k]; !set || svc(k) != v {
				t.Errorf("%s=%q (set %v), want %q", k, svc(k), got != nil, v)
			}
		}
		// A process started by an earlier reaperd must stay visible and
		// signalable by the next one: the same PID and user namespaces.
		for _, k := range []string{"PrivatePIDs", "PrivateUsers", "DynamicUser"} {
			if _, set := u["Service"][k]; set {
				t.Errorf("%s is set: a restarted reaperd could no longer signal the agents started before it", k)
			}
		}
		if tool, err := exec.LookPath("systemd-analyze"); err == nil {
			// --threshold fails when the exposure (0-100, shown /10) is above it.
			out, err := exec.Command(tool, "security", "--offline=true", "--threshold=30", unitPath).CombinedOutput()
			if err != nil {
				t.Errorf("systemd-analyze security: %v\n%s", err, out)
			}
			if m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out); m != nil {
				t.Logf("systemd-analyze security: exposure %s (0 best, 10 worst)", m[1])
			}
		}
	})

	t.Run("LandlockCallsAllowed", func(t *testing.T) {
		// Filtered out, they fail with EPERM and plugins start without
		// reaperd's secrets hidden.
		filter := strings.Join(u["Service"]["SystemCallFilter"], " ")
		for _, call := range []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"} {
			if !strings.Contains(" "+filter+" ", " "+call+" ") {
				t.Errorf("SystemCallFilter=%s does not allow %s", filter, call)
			}
		}
	})

	t.Run("RunAsDropInGrantsExactlyTheCapabilitiesTheAgentsUse", func(t *testing.T) {
		// docs/operate.md's drop-in for runner.run_as: CAP_SETUID and
		// CAP_SETGID (to start a task as the run_as user and to signal it
		// as that user), never CAP_KILL; test/tasksecrets runs the agent
		// with exactly these.
		doc := string(readFile(t, "../docs/operate.md"))
		block := regexp.MustCompile("(?s)```ini\n(\\[Service\\]\nAmbientCapabilities=[^`]*)```").FindStringSubmatch(doc)
		if block == nil {
			t.Fatal("docs/operate.md has no run_as drop-in with AmbientCapabilities=")
		}
		dropIn, err := parseUnit([]byte("[Unit]\n[Install]\n" + block[1]))
		if err != nil {
			t.Fatalf("the drop-in: %v", err)
		}
		for _, k := range []string{"AmbientCapabilities", "CapabilityBoundingSet"} {
			if got := dropIn.get("Service", k); got != "CAP_SETUID CAP_SETGID" {
				t.Errorf("the drop-in's %s=%q, want exactly CAP_SETUID CAP_SETGID", k, got)
			}
		}
		// The unit with the drop-in applied still passes systemd's check.
		withDropIn := append(append([]byte(nil), src...), []byte("\n"+block[1])...)
		if out, ok, err := systemdVerify(t, withDropIn); ok && err != nil {
			t.Errorf("systemd-analyze verify of the unit with the drop-in: %v\n%s", err, out)
		}
	})

	t.Run("LogsWhereTheRunnerWrites", func(t *testing.T) {
		logs := svc("LogsDirectory")
		if !regexp.MustCompile(`(?m)^\s*log_dir\s*=\s*"/var/log/` + regexp.QuoteMeta(logs) + `"`).Match(readFile(t, liteHCLPath)) {
			t.Errorf("%s: runner.log_dir should be the unit's LogsDirectory /var/log/%s", liteHCLPath, logs)
		}
	})
}

func parseBool(s string) (bool, bool) {
	switch s {
	case "yes", "true", "on", "1":
		return true, true
	case "no", "false", "off", "0":
		return false, true
	}
	return false, false
}
