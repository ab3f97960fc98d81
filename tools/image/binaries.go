package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// mainPatterns are where the product's commands live: the host, the CLI
// and the execution side's agent (cmd/), every reaper plugin and both
// substrates (each in its own folder). The demo, the examples and the test
// helpers are left out on purpose.
var mainPatterns = []string{"./cmd/...", "./plugins/...", "./substrate/..."}

// versionVar is the variable the Makefile stamps the version into.
const versionVar = "github.com/dexaflow/reaper/sdk.BuildVersion"

// Binary is one static executable built for the image.
type Binary struct {
	Name string // the file name, the last element of its import path
	Path string // where it was built
}

// BuildConfig says what to build and where.
type BuildConfig struct {
	// Root is the product module's directory.
	Root string
	// Out receives the binaries.
	Out string
	// Version is stamped into every binary (sdk.BuildVersion).
	Version string
	// GOARCH of the binaries; Linux is the only GOOS an image runs.
	GOARCH string
	// Tags are build tags (go build -tags), comma-separated; empty for a
	// release. The install tier's upgrade builds a second image with the
	// board's probe migration (reaper_upgrade_probe).
	Tags string
}

// mainPackages lists the import paths of the product's commands under Root.
func mainPackages(ctx context.Context, root string) ([]string, error) {
	args := append([]string{"list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`}, mainPatterns...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the commands under %s: %w: %s", root, err, stderr.String())
	}
	var pkgs []string
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			pkgs = append(pkgs, line)
		}
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("listing the commands under %s: none found", root)
	}
	sort.Strings(pkgs)
	return pkgs, nil
}

// BuildBinaries builds every command of the product as a static Linux
// executable (CGO_ENABLED=0, -trimpath, no symbol table) into c.Out, in one
// go build so the packages they share compile once.
func BuildBinaries(ctx context.Context, c BuildConfig) ([]Binary, error) {
	pkgs, err := mainPackages(ctx, c.Root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", c.Out, err)
	}
	out, err := filepath.Abs(c.Out)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", c.Out, err)
	}
	args := []string{"build", "-trimpath",
		"-ldflags", fmt.Sprintf("-s -w -X %s=%s", versionVar, c.Version),
		"-o", out + string(filepath.Separator)}
	if c.Tags != "" {
		args = append(args, "-tags", c.Tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = c.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+c.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %d commands: %w: %s", len(pkgs), err, b)
	}
	bins := make([]Binary, 0, len(pkgs))
	for _, p := range pkgs {
		name := p[strings.LastIndex(p, "/")+1:]
		path := filepath.Join(out, name)
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("building %s: %w", p, err)
		}
		bins = append(bins, Binary{Name: name, Path: path})
	}
	return bins, nil
}
