package kubetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// SourceDir is where the nested modules that pin the cluster's binaries
// (and Helm, which the chart's tests run against the cluster) live, relative
// to the repository root.
const SourceDir = "tools/kubecluster"

// NodeSourceDir is where the nested module of the real node's binaries (the
// kubelet, the pause process, the image writer) lives, relative to the
// repository root. A module apart from SourceDir: its own cache key, so a
// change to it never rebuilds the control plane.
const NodeSourceDir = "tools/kubenode"

// The versions the nested modules pin; the build stamps them into the
// binaries (an unstamped kube-apiserver reports v0.0.0-master).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.0"
	KWOKVersion       = "v0.8.0"
	HelmVersion       = "v3.22.0"
	// KubeRouterVersion is the NetworkPolicy enforcer's (tools/kubenode/netpol).
	KubeRouterVersion = "v2.1.0"
)

// Binaries are the paths of the cluster's executables.
type Binaries struct {
	Dir                   string
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string
	KWOK                  string
	Helm                  string
}

// NodeBinaries are the paths of the real node's executables.
type NodeBinaries struct {
	Dir string
	// Kubelet is the upstream kubelet at KubernetesVersion.
	Kubelet string
	// Pause is the sandbox image's process.
	Pause string
	// NodeImage writes an image of local files as a docker archive.
	NodeImage string
	// KubeScheduler and KubeProxy are the upstream ones at
	// KubernetesVersion, CoreDNS the cluster DNS (its nested module
	// coredns) and KubeRouter the NetworkPolicy enforcer (its nested
	// module netpol), for a cluster that hosts in-cluster workloads.
	KubeScheduler, KubeProxy, CoreDNS, KubeRouter string
}

func nodeBinariesIn(dir string) NodeBinaries {
	return NodeBinaries{Dir: dir, Kubelet: filepath.Join(dir, "kubelet"),
		Pause: filepath.Join(dir, "pause"), NodeImage: filepath.Join(dir, "nodeimage"),
		KubeScheduler: filepath.Join(dir, "kube-scheduler"), KubeProxy: filepath.Join(dir, "kube-proxy"),
		CoreDNS: filepath.Join(dir, "coredns"), KubeRouter: filepath.Join(dir, "kube-router")}
}

// binarySet is one cached set of binaries built from one nested module.
type binarySet struct {
	what     string // what the progress lines call it
	source   string // relative to the repository root
	cache    string // the cache directory's name under the user's cache
	targets  []target
	estimate string // what a first build costs, for the progress line
}

func clusterSet() binarySet {
	return binarySet{what: fmt.Sprintf("the test cluster's binaries (kubernetes %s, etcd %s, kwok %s, helm %s)",
		KubernetesVersion, EtcdVersion, KWOKVersion, HelmVersion),
		source: SourceDir, cache: "kubecluster", targets: targets(),
		estimate: "a first build takes about 18 minutes on 2 idle cores (longer on a busy machine) and up to 2.7 GB of memory; later starts reuse it"}
}

func nodeSet() binarySet {
	return binarySet{what: fmt.Sprintf("the real node's binaries (kubelet, kube-proxy and kube-scheduler %s, CoreDNS, kube-router, pause, nodeimage)", KubernetesVersion),
		source: NodeSourceDir, cache: "kubenode", targets: nodeTargets(),
		estimate: "about 8 minutes when the control plane's build is cached (the Go build cache is shared), about 14 minutes cold, up to 2 GB of memory"}
}

// nodeTargets lists what BuildNode makes, in order. Part of its cache key.
func nodeTargets() []target {
	return []target{
		{name: "kubelet", module: ".", pkg: "./cmd/kubelet", ldflags: "-s -w " + versionStamp()},
		{name: "pause", module: ".", pkg: "./cmd/pause", ldflags: "-s -w"},
		{name: "nodeimage", module: ".", pkg: "./cmd/nodeimage", ldflags: "-s -w"},
		{name: "kube-proxy", module: ".", pkg: "./cmd/kube-proxy", ldflags: "-s -w " + versionStamp()},
		{name: "kube-scheduler", module: ".", pkg: "./cmd/kube-scheduler", ldflags: "-s -w " + versionStamp()},
		{name: "coredns", module: "coredns", pkg: "./cmd/coredns", ldflags: "-s -w"},
		{name: "kube-router", module: "netpol", pkg: "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
			ldflags: "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=" + KubeRouterVersion},
	}
}

func versionStamp() string {
	return strings.Join([]string{
		"-X k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/component-base/version.gitMinor=37",
	}, " ")
}

// target is one binary of the build: the package built, from which module
// directory (relative to SourceDir), with which linker flags.
type target struct {
	name    string
	module  string
	pkg     string
	ldflags string
}

// targets lists what Build makes, in order. Part of the cache key.
func targets() []target {
	stamp := versionStamp()
	return []target{
		{name: "etcd", module: ".", pkg: "./cmd/etcd", ldflags: "-s -w"},
		{name: "kube-apiserver", module: ".", pkg: "./cmd/kube-apiserver", ldflags: "-s -w " + stamp},
		{name: "kube-controller-manager", module: ".", pkg: "./cmd/kube-controller-manager", ldflags: "-s -w " + stamp},
		{name: "kwok", module: "kwok", pkg: "sigs.k8s.io/kwok/cmd/kwok", ldflags: "-s -w"},
		{name: "helm", module: "helm", pkg: "helm.sh/helm/v3/cmd/helm",
			ldflags: "-s -w -X helm.sh/helm/v3/internal/version.version=" + HelmVersion},
	}
}

// buildEnv is the environment of every build: the nested module alone (no
// workspace), exactly its go.sum, a static binary. Part of the cache key.
func buildEnv() []string {
	return []string{"GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0"}
}

// BuildOptions configure Build.
type BuildOptions struct {
	// Source is the nested module's directory; default: SourceDir under
	// the repository that holds the working directory.
	Source string
	// CacheDir is where built binaries are kept; default:
	// os.UserCacheDir()/reaper/kubecluster.
	CacheDir string
	// Progress receives one line per step and a line every 30 seconds
	// while a binary builds; default os.Stderr.
	Progress io.Writer
}

// Build returns the cluster's binaries, building them first when the cache
// holds none for the nested module's current content. A cold build takes
// about eighteen minutes on two idle cores; a cached one costs a hash of a few
// files. Concurrent callers (test binaries of several packages) wait for one
// build.
func Build(ctx context.Context, opts BuildOptions) (Binaries, error) {
	dir, err := buildSet(ctx, clusterSet(), opts, func(dir string) bool { return binariesIn(dir).complete() })
	if err != nil {
		return Binaries{}, err
	}
	return binariesIn(dir), nil
}

// BuildNode returns the real node's binaries (NodeSourceDir), building them
// first when the cache (os.UserCacheDir()/reaper/kubenode unless
// opts.CacheDir) holds none for the module's current content. opts.Source,
// when set, is the node module's directory.
func BuildNode(ctx context.Context, opts BuildOptions) (NodeBinaries, error) {
	dir, err := buildSet(ctx, nodeSet(), opts, func(dir string) bool { return allExecutable(nodeBinariesIn(dir).paths()...) })
	if err != nil {
		return NodeBinaries{}, err
	}
	return nodeBinariesIn(dir), nil
}

func (b NodeBinaries) paths() []string {
	return []string{b.Kubelet, b.Pause, b.NodeImage, b.KubeProxy, b.KubeScheduler, b.CoreDNS, b.KubeRouter}
}

// buildSet returns the cache directory of set for its module's current
// content, building it under a lock when complete says it is not there.
func buildSet(ctx context.Context, set binarySet, opts BuildOptions, complete func(string) bool) (string, error) {
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	src := opts.Source
	if src == "" {
		var err error
		if src, err = findSource(set.source); err != nil {
			return "", err
		}
	}
	cacheRoot := opts.CacheDir
	if cacheRoot == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("kubetest: find the user's cache directory for %s: %w", set.what, err)
		}
		cacheRoot = filepath.Join(dir, "reaper", set.cache)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("kubetest: %s are built from source and need the go command on PATH: %w", set.what, err)
	}
	key, err := cacheKey(ctx, gobin, src, set.targets)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheRoot, key)
	if complete(dir) {
		touch(dir)
		return dir, nil
	}

	if err := os.MkdirAll(cacheRoot, 0o755); err != nil {
		return "", fmt.Errorf("kubetest: make the binary cache %s: %w", cacheRoot, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheRoot, "build.lock"), opts.Progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	if complete(dir) { // another process built them while this one waited
		return dir, nil
	}
	removeAbandoned(cacheRoot) // safe: builds happen only under the lock
	if err := build(ctx, gobin, src, dir, set, opts.Progress); err != nil {
		return "", err
	}
	pruneCache(cacheRoot, key)
	return dir, nil
}

func binariesIn(dir string) Binaries {
	return Binaries{
		Dir:                   dir,
		Etcd:                  filepath.Join(dir, "etcd"),
		KubeAPIServer:         filepath.Join(dir, "kube-apiserver"),
		KubeControllerManager: filepath.Join(dir, "kube-controller-manager"),
		KWOK:                  filepath.Join(dir, "kwok"),
		Helm:                  filepath.Join(dir, "helm"),
	}
}

func (b Binaries) complete() bool {
	return allExecutable(b.Etcd, b.KubeAPIServer, b.KubeControllerManager, b.KWOK, b.Helm)
}

func allExecutable(paths ...string) bool {
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// build builds every target into a fresh directory beside dir and renames
// it to dir when all are built, so that dir is either complete or absent.
func build(ctx context.Context, gobin, src, dir string, set binarySet, progress io.Writer) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return fmt.Errorf("kubetest: make a build directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	all := set.targets
	start := time.Now()
	fmt.Fprintf(progress, "kubetest: building %s into %s\n", set.what, dir)
	fmt.Fprintf(progress, "kubetest: %s\n", set.estimate)
	for i, t := range all {
		step := fmt.Sprintf("[%d/%d] %s", i+1, len(all), t.name)
		if err := buildOne(ctx, gobin, src, tmp, t, step, progress); err != nil {
			return err
		}
	}
	_ = os.RemoveAll(dir) // a partial directory from an older layout
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("kubetest: move the built binaries to %s: %w", dir, err)
	}
	fmt.Fprintf(progress, "kubetest: %s ready in %s\n", set.what, time.Since(start).Round(time.Second))
	return nil
}

func buildOne(ctx context.Context, gobin, src, out string, t target, step string, progress io.Writer) error {
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-ldflags", t.ldflags,
		"-o", filepath.Join(out, t.name), t.pkg)
	cmd.Dir = filepath.Join(src, t.module)
	cmd.Env = append(os.Environ(), buildEnv()...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	// The build is this process's child: it dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	begin := time.Now()
	fmt.Fprintf(progress, "kubetest: %s: building\n", step)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kubetest: %s: start go build: %w", step, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // owned here: always received below
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("kubetest: %s: go build in %s: %w\n%s", step, cmd.Dir, err, tail(stderr.Bytes(), 8000))
			}
			fmt.Fprintf(progress, "kubetest: %s: built in %s\n", step, time.Since(begin).Round(time.Second))
			return nil
		case <-tick.C:
			fmt.Fprintf(progress, "kubetest: %s: still building, %s so far\n", step, time.Since(begin).Round(time.Second))
		}
	}
}

// cacheKey hashes what decides the binaries: the nested modules' go.mod,
// go.sum and Go files, the targets and their flags, the build environment
// and the Go toolchain.
func cacheKey(ctx context.Context, gobin, src string, tgts []target) (string, error) {
	out, err := exec.CommandContext(ctx, gobin, "env", "GOVERSION", "GOOS", "GOARCH").Output()
	if err != nil {
		return "", fmt.Errorf("kubetest: ask go for its version: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "toolchain %s\nenv %q\n", strings.Fields(string(out)), buildEnv())
	for _, t := range tgts {
		fmt.Fprintf(h, "target %q %q %q %q\n", t.name, t.module, t.pkg, t.ldflags)
	}
	var files []string
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if !d.IsDir() && (name == "go.mod" || name == "go.sum" || strings.HasSuffix(name, ".go")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("kubetest: read the cluster's module %s: %w", src, err)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("kubetest: read %s: %w", f, err)
		}
		rel, _ := filepath.Rel(src, f)
		fmt.Fprintf(h, "file %q %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// findSource finds rel (SourceDir, NodeSourceDir) in the working directory
// or one of its parents (a test runs in its package's directory, make in
// the root).
func findSource(rel string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		src := filepath.Join(dir, filepath.FromSlash(rel))
		if _, err := os.Stat(filepath.Join(src, "go.mod")); err == nil {
			return src, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("kubetest: %s/go.mod is not in %s or any parent: run from inside the reaper repository", rel, wd)
		}
	}
}

// lockFile takes an exclusive lock on path, saying so when it has to wait
// (it polls: a blocked flock cannot be abandoned when ctx ends).
func lockFile(ctx context.Context, path string, progress io.Writer) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubetest: open the build lock: %w", err)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for said := false; ; said = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("kubetest: lock %s: %w", path, err)
		}
		if !said {
			fmt.Fprintf(progress, "kubetest: another process is building the cluster's binaries; waiting for it\n")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("kubetest: wait for the build lock: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// pruneCache removes binary sets other than key that have not been used
// for a week (each set is a few hundred megabytes).
func pruneCache(root, key string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if !e.IsDir() || e.Name() == key || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > 7*24*time.Hour {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// removeAbandoned removes the build directories of builds that were killed.
func removeAbandoned(root string) {
	dirs, _ := filepath.Glob(filepath.Join(root, ".build-*"))
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

func touch(dir string) {
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
