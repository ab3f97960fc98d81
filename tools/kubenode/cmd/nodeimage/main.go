// Command nodeimage writes a container image of local files as a docker
// archive (the tarball ctr images import reads), offline: one layer with
// the files given, the directories a container's runtime mounts over, and
// symbolic links, on an empty base. The real node's pause and task images
// are made with it.
//
//	nodeimage -o OUT.tar -tag NAME:TAG [-file SRC=DST]... [-link DST=TARGET]...
//	          [-entrypoint PATH]... [-env K=V]...
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nodeimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("nodeimage", flag.ContinueOnError)
	out := fs.String("o", "", "the docker archive to write")
	tag := fs.String("tag", "", "the image's name and tag")
	var files, links, entry, env list
	fs.Var(&files, "file", "SRC=DST: a local file put at DST, mode kept")
	fs.Var(&links, "link", "DST=TARGET: a symbolic link")
	fs.Var(&entry, "entrypoint", "one word of the entrypoint (repeat)")
	fs.Var(&env, "env", "K=V in the image's environment (repeat)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" {
		return fmt.Errorf("-o and -tag are required")
	}
	ref, err := name.NewTag(*tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("tag %q: %w", *tag, err)
	}
	layerTar, err := layer(files, links)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("make the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return fmt.Errorf("add the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config = v1.Config{Entrypoint: entry, Env: env, WorkingDir: "/"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("set the config: %w", err)
	}
	if err := tarball.WriteToFile(*out, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	return nil
}

// layer is the tar of the image's one layer.
func layer(files, links list) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{"dev": true, "proc": true, "sys": true, "tmp": true, "etc": true, "bin": true, "usr": true, "usr/local": true, "usr/local/bin": true}
	type item struct{ dst, src, link string }
	var items []item
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("-file %q: want SRC=DST", f)
		}
		items = append(items, item{dst: strings.TrimPrefix(path.Clean(dst), "/"), src: src})
	}
	for _, f := range links {
		dst, target, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("-link %q: want DST=TARGET", f)
		}
		items = append(items, item{dst: strings.TrimPrefix(path.Clean(dst), "/"), link: target})
	}
	for _, it := range items {
		for d := path.Dir(it.dst); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].dst < items[j].dst })
	for _, it := range items {
		if it.link != "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: it.dst, Linkname: it.link, Mode: 0o777, ModTime: epoch}); err != nil {
				return nil, err
			}
			continue
		}
		b, err := os.ReadFile(it.src)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", it.src, err)
		}
		st, err := os.Stat(it.src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: it.dst, Mode: int64(st.Mode().Perm()), Size: int64(len(b)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
