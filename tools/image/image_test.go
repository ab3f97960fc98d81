package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const root = "../.."

// file is one entry of the image's layer as the test read it back.
type file struct {
	hdr  *tar.Header
	data []byte // regular files only
}

type bundle struct {
	version string
	created time.Time
	bins    []Binary
	out     string
	digest  v1.Hash
	img     v1.Image // read back from the OCI layout
	cfg     *v1.ConfigFile
	files   map[string]file // by absolute path
}

// setup builds the binaries and the image once, writes both outputs, and
// reads the image back from the OCI layout, as a user of it would.
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	b := &bundle{version: "v0.0.0-imagetest", created: time.Unix(1700000000, 0).UTC(), out: t.TempDir()}
	scratch := t.TempDir()
	start := time.Now()
	bins, err := BuildBinaries(ctx, BuildConfig{Root: root, Out: filepath.Join(scratch, "bin"), Version: b.version, GOARCH: runtime.GOARCH})
	if err != nil {
		t.Fatalf("building the binaries: %v", err)
	}
	t.Logf("built %d static binaries in %s", len(bins), time.Since(start).Round(time.Millisecond))
	b.bins = bins
	img, err := Assemble(bins, ImageConfig{Version: b.version, Source: SourceDefault, GOARCH: runtime.GOARCH, Created: b.created, Scratch: scratch})
	if err != nil {
		t.Fatalf("assembling: %v", err)
	}
	if err := Write(img, b.out, b.version); err != nil {
		t.Fatalf("writing: %v", err)
	}
	if b.digest, err = img.Digest(); err != nil {
		t.Fatal(err)
	}

	p, err := layout.FromPath(filepath.Join(b.out, LayoutDir))
	if err != nil {
		t.Fatalf("opening the layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("layout holds %d manifests, want 1", len(m.Manifests))
	}
	if b.img, err = p.Image(m.Manifests[0].Digest); err != nil {
		t.Fatalf("reading the image from the layout: %v", err)
	}
	if b.cfg, err = b.img.ConfigFile(); err != nil {
		t.Fatal(err)
	}
	layers, err := b.img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1 (an empty base and the binaries)", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b.files = map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading the layer: %v", err)
		}
		f := file{hdr: h}
		if h.Typeflag == tar.TypeReg {
			if f.data, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
		b.files["/"+strings.TrimSuffix(h.Name, "/")] = f
	}
	size, _ := layers[0].Size()
	t.Logf("image %s: one layer of %d entries, %.1f MiB compressed", b.digest, len(b.files), float64(size)/(1<<20))
	return b
}

func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary of the product")
	}
	b := setup(t)

	t.Run("EntrypointRunsReaperdWithTheConfig", func(t *testing.T) {
		got := strings.Join(append(append([]string{}, b.cfg.Config.Entrypoint...), b.cfg.Config.Cmd...), " ")
		if want := "/usr/local/bin/reaperd run -config /etc/reaper/reaper.hcl"; got != want {
			t.Errorf("entrypoint and cmd = %q, want %q", got, want)
		}
		if b.cfg.OS != "linux" || b.cfg.Architecture != runtime.GOARCH {
			t.Errorf("platform = %s/%s", b.cfg.OS, b.cfg.Architecture)
		}
	})

	t.Run("UserIsNumericAndNotRoot", func(t *testing.T) {
		uid, gid, ok := strings.Cut(b.cfg.Config.User, ":")
		u, err1 := strconv.Atoi(uid)
		g, err2 := strconv.Atoi(gid)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("user %q: want numeric uid:gid (a name needs /etc/passwd and cannot be checked by runAsNonRoot)", b.cfg.Config.User)
		}
		if u == 0 || g == 0 {
			t.Errorf("user %q runs as root", b.cfg.Config.User)
		}
	})

	t.Run("EveryCommandIsInTheLayerExecutableAndStatic", func(t *testing.T) {
		if len(b.bins) == 0 {
			t.Fatal("no binaries")
		}
		for _, bin := range b.bins {
			f, ok := b.files[path.Join(BinDir, bin.Name)]
			if !ok {
				t.Errorf("%s missing from the layer", bin.Name)
				continue
			}
			if f.hdr.Mode&0o111 != 0o111 || f.hdr.Uid != 0 || f.hdr.Mode&0o022 != 0 {
				t.Errorf("%s: mode %o uid %d, want executable by all, root-owned, writable by root only", bin.Name, f.hdr.Mode, f.hdr.Uid)
			}
			e, err := elf.NewFile(bytes.NewReader(f.data))
			if err != nil {
				t.Errorf("%s: not an ELF executable: %v", bin.Name, err)
				continue
			}
			for _, p := range e.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s is dynamically linked (it names an interpreter); an empty base has none", bin.Name)
				}
			}
			if libs, _ := e.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("%s needs shared libraries %v", bin.Name, libs)
			}
		}
	})

	t.Run("CommandsAreTheMakefilesBinaries", func(t *testing.T) {
		want := makefileBinaries(t)
		var got []string
		for _, bin := range b.bins {
			got = append(got, bin.Name)
		}
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("image commands %v, make build's BINARIES %v", got, want)
		}
	})

	t.Run("NoShellNorOtherProgram", func(t *testing.T) {
		names := map[string]bool{}
		for _, bin := range b.bins {
			names[path.Join(BinDir, bin.Name)] = true
		}
		for p, f := range b.files {
			if f.hdr.Typeflag == tar.TypeSymlink || f.hdr.Typeflag == tar.TypeLink {
				t.Errorf("%s is a link", p)
			}
			if f.hdr.Typeflag == tar.TypeReg && f.hdr.Mode&0o111 != 0 && !names[p] {
				t.Errorf("%s is executable but not one of the product's commands", p)
			}
		}
		for _, sh := range []string{"/bin/sh", "/bin/bash", "/bin/busybox", "/usr/bin/env"} {
			if _, ok := b.files[sh]; ok {
				t.Errorf("%s is in the image", sh)
			}
		}
	})

	t.Run("OnlyTheStateVolumeIsWritable", func(t *testing.T) {
		c := b.cfg.Config
		if _, ok := c.Volumes[StateDir]; !ok || len(c.Volumes) != 1 {
			t.Errorf("volumes %v, want exactly %s", c.Volumes, StateDir)
		}
		if c.WorkingDir != StateDir {
			t.Errorf("working dir %q, want the volume %s", c.WorkingDir, StateDir)
		}
		if env := envOf(c.Env); env["TMPDIR"] != StateDir {
			t.Errorf("TMPDIR %q, want the volume %s (the Lite record directory and go-plugin's sockets)", env["TMPDIR"], StateDir)
		}
		uid, _, _ := strings.Cut(c.User, ":")
		for p, f := range b.files {
			owned := strconv.Itoa(f.hdr.Uid) == uid
			writable := f.hdr.Mode&0o002 != 0 || (owned && f.hdr.Mode&0o200 != 0)
			if writable && p != StateDir {
				t.Errorf("%s (mode %o, uid %d) is writable by the user outside the volume", p, f.hdr.Mode, f.hdr.Uid)
			}
		}
		if st, ok := b.files[StateDir]; !ok || strconv.Itoa(st.hdr.Uid) != uid || st.hdr.Mode&0o077 != 0 {
			t.Errorf("%s must exist, owned by the user, mode 0700 (the record directory's parent)", StateDir)
		}
	})

	t.Run("LabelsNameVersionAndSource", func(t *testing.T) {
		l := b.cfg.Config.Labels
		if l[LabelVersion] != b.version || l[LabelSource] != SourceDefault {
			t.Errorf("labels %v", l)
		}
		if !b.cfg.Created.Time.Equal(b.created) {
			t.Errorf("created %s, want %s", b.cfg.Created.Time, b.created)
		}
	})

	t.Run("ReaperdFromTheLayerRuns", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("the image's binaries are Linux executables")
		}
		dir := t.TempDir()
		exe := filepath.Join(dir, "reaperd")
		if err := os.WriteFile(exe, b.files[path.Join(BinDir, "reaperd")].data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(exe, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("reaperd version: %v: %s", err, out)
		}
		if !regexp.MustCompile(`^reaperd ` + regexp.QuoteMeta(b.version) + ` \(plugin protocol \d+\)\n$`).Match(out) {
			t.Errorf("reaperd version printed %q", out)
		}
	})

	t.Run("TarballHoldsTheSameImage", func(t *testing.T) {
		img, err := tarball.ImageFromPath(filepath.Join(b.out, TarballName), nil)
		if err != nil {
			t.Fatalf("reading the tarball: %v", err)
		}
		cfgName, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := b.img.ConfigName()
		if cfgName != want {
			t.Errorf("tarball config %s, layout config %s", cfgName, want)
		}
	})

	t.Run("SameBinariesSameDigest", func(t *testing.T) {
		img, err := Assemble(b.bins, ImageConfig{Version: b.version, Source: SourceDefault, GOARCH: runtime.GOARCH, Created: b.created, Scratch: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if d != b.digest {
			t.Errorf("a second assembly gave %s, the first %s", d, b.digest)
		}
	})
}

// makefileBinaries reads the names of the BINARIES list of the product's
// Makefile, the set `make build` installs.
func makefileBinaries(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	item := regexp.MustCompile(`^\s+([a-z][a-z0-9-]*)=\./\S+\s*\\?$`)
	var names []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "BINARIES"):
			in = true
		case in:
			m := item.FindStringSubmatch(line)
			if m == nil {
				in = false
				continue
			}
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatal("no BINARIES list in the Makefile")
	}
	sort.Strings(names)
	return names
}

func envOf(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}
