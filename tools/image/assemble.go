package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's file system: the binaries, root-owned and read-only for the
// user that runs them; the configuration's mount point; one directory the
// daemon may write, declared as a volume (TMPDIR points at it, so the Lite
// record directory and go-plugin's sockets land there).
const (
	BinDir     = "/usr/local/bin"
	ConfigDir  = "/etc/reaper"
	ConfigPath = ConfigDir + "/reaper.hcl"
	StateDir   = "/var/lib/reaper"
	// UID and GID run the daemon: not root, not an id a host account is
	// likely to have (the distroless "nonroot" id).
	UID = 65532
	GID = 65532
	// MetricsPort is telemetry.listen's default port.
	MetricsPort = "9464/tcp"
)

// Label keys of the OCI image-spec annotations, used as config labels.
const (
	LabelVersion     = "org.opencontainers.image.version"
	LabelSource      = "org.opencontainers.image.source"
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
)

// ImageConfig says what the image is.
type ImageConfig struct {
	Version string
	// Source is the product's source repository, for the source label.
	Source string
	GOARCH string
	// Created stamps the config and every file: a fixed time makes the
	// image reproducible (the same binaries give the same digest).
	Created time.Time
	// Scratch holds the layer's tar while the image is written.
	Scratch string
}

// entry is one file or directory of the layer.
type entry struct {
	name     string // absolute path in the image
	mode     int64
	uid, gid int
	dir      bool
	data     []byte // a small file's content
	src      string // a file copied from the build (the binaries)
}

// files lists the layer's entries: the directories first, parents before
// children, then the files, each group in name order.
func files(bins []Binary) []entry {
	es := []entry{
		{name: "/etc", mode: 0o755, dir: true},
		{name: ConfigDir, mode: 0o755, dir: true},
		{name: "/usr", mode: 0o755, dir: true},
		{name: "/usr/local", mode: 0o755, dir: true},
		{name: BinDir, mode: 0o755, dir: true},
		{name: "/var", mode: 0o755, dir: true},
		{name: "/var/lib", mode: 0o755, dir: true},
		{name: StateDir, mode: 0o700, uid: UID, gid: GID, dir: true},
		// Account names for the numeric ids, so tools that look the user up
		// (ps, id, os/user) find one; no shell is named because none exists.
		{name: "/etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nreaper:x:%d:\n", GID))},
		{name: "/etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf(
			"root:x:0:0:root:/root:/sbin/nologin\nreaper:x:%d:%d:reaper:%s:/sbin/nologin\n", UID, GID, StateDir))},
	}
	sorted := append([]Binary(nil), bins...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, b := range sorted {
		es = append(es, entry{name: path.Join(BinDir, b.Name), mode: 0o755, src: b.Path})
	}
	return es
}

// writeLayer writes the layer's tar to w.
func writeLayer(w io.Writer, es []entry, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, e := range es {
		if err := writeEntry(tw, e, mtime); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing the layer: %w", err)
	}
	return nil
}

// writeEntry writes one entry, its header and its content.
func writeEntry(tw *tar.Writer, e entry, mtime time.Time) error {
	h := &tar.Header{
		Name:    e.name[1:], // relative, as layers are
		Mode:    e.mode,
		Uid:     e.uid,
		Gid:     e.gid,
		ModTime: mtime,
		Format:  tar.FormatPAX,
	}
	var body io.Reader
	switch {
	case e.dir:
		h.Typeflag = tar.TypeDir
		h.Name += "/"
	case e.src != "":
		f, err := os.Open(e.src)
		if err != nil {
			return fmt.Errorf("adding %s: %w", e.name, err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("adding %s: %w", e.name, err)
		}
		h.Typeflag, h.Size, body = tar.TypeReg, st.Size(), f
	default:
		h.Typeflag, h.Size, body = tar.TypeReg, int64(len(e.data)), bytes.NewReader(e.data)
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("adding %s: %w", e.name, err)
	}
	if body != nil {
		if _, err := io.Copy(tw, body); err != nil {
			return fmt.Errorf("adding %s: %w", e.name, err)
		}
	}
	return nil
}

// Assemble builds the image: one layer holding the binaries on an empty
// base, and a config that runs reaperd as a non-root user.
func Assemble(bins []Binary, c ImageConfig) (v1.Image, error) {
	tarPath := filepath.Join(c.Scratch, "layer.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		return nil, fmt.Errorf("creating the layer: %w", err)
	}
	if err := writeLayer(f, files(bins), c.Created); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	layer, err := tarball.LayerFromFile(tarPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("reading the layer back: %w", err)
	}

	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: c.Created}, CreatedBy: "tools/image: reaper's static binaries", Comment: c.Version},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = c.GOARCH
	cf.OS = "linux"
	cf.Created = v1.Time{Time: c.Created}
	cf.Config = v1.Config{
		Entrypoint: []string{path.Join(BinDir, "reaperd")},
		Cmd:        []string{"run", "-config", ConfigPath},
		User:       strconv.Itoa(UID) + ":" + strconv.Itoa(GID),
		WorkingDir: StateDir,
		Env: []string{
			"PATH=" + BinDir,
			// TMPDIR holds the Lite record directory and go-plugin's sockets:
			// it must be writable, and it is the declared volume.
			"TMPDIR=" + StateDir,
		},
		Volumes:      map[string]struct{}{StateDir: {}},
		ExposedPorts: map[string]struct{}{MetricsPort: {}},
		Labels: map[string]string{
			LabelVersion:     c.Version,
			LabelSource:      c.Source,
			LabelTitle:       "reaper",
			LabelDescription: "reaperd and its plugins: turns a workflow scheduler's stuck state into honest terminal state",
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("writing the config: %w", err)
	}
	return img, nil
}
