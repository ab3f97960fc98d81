// Command image builds reaper's container image without a daemon, a registry
// or a base image: it builds every command of the product as a static Linux
// binary, puts them in one layer on an empty base, and writes the image as an
// OCI image layout and as a tarball that `docker load` and `podman load`
// read.
//
//	go run . -root ../.. -out ../../bin/image -version v1.2.3
//
// The image runs `reaperd run -config /etc/reaper/reaper.hcl` as uid 65532,
// with TMPDIR and the working directory on the one volume it writes
// (/var/lib/reaper), so the root file system can be mounted read-only. It
// holds no shell and no other program.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// SourceDefault is the source label's default: the product's repository.
const SourceDefault = "https://github.com/dexaflow/reaper"

// Output names under the output directory.
const (
	LayoutDir   = "oci"
	TarballName = "reaper.tar"
)

// Options are the command's flags.
type Options struct {
	Root    string // the product module
	Out     string // the output directory
	Version string
	Source  string
	GOARCH  string
	Tags    string
	Created time.Time
}

func main() {
	var o Options
	var created int64
	flag.StringVar(&o.Root, "root", "../..", "the product module's directory")
	flag.StringVar(&o.Out, "out", "../../bin/image", "output directory: an OCI layout in oci/ and "+TarballName)
	flag.StringVar(&o.Version, "version", "dev", "the version stamped into the binaries and the labels")
	flag.StringVar(&o.Source, "source", SourceDefault, "the source label")
	flag.StringVar(&o.GOARCH, "goarch", runtime.GOARCH, "the architecture of the image")
	flag.StringVar(&o.Tags, "tags", "", "build tags of the binaries, comma-separated (none for a release)")
	flag.Int64Var(&created, "created", sourceDateEpoch(), "creation time, unix seconds (default $SOURCE_DATE_EPOCH, else 0): fixed, so a build is reproducible")
	flag.Parse()
	o.Created = time.Unix(created, 0).UTC()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	digest, err := Build(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("image %s\n  %s\n  %s\n", digest, filepath.Join(o.Out, LayoutDir), filepath.Join(o.Out, TarballName))
}

func sourceDateEpoch() int64 {
	n, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Build builds the binaries and the image, and writes both outputs,
// replacing earlier ones. It returns the image's manifest digest.
func Build(ctx context.Context, o Options) (v1.Hash, error) {
	scratch, err := os.MkdirTemp("", "reaper-image-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("creating a scratch directory: %w", err)
	}
	defer os.RemoveAll(scratch)

	bins, err := BuildBinaries(ctx, BuildConfig{Root: o.Root, Out: filepath.Join(scratch, "bin"), Version: o.Version, GOARCH: o.GOARCH, Tags: o.Tags})
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := Assemble(bins, ImageConfig{Version: o.Version, Source: o.Source, GOARCH: o.GOARCH, Created: o.Created, Scratch: scratch})
	if err != nil {
		return v1.Hash{}, err
	}
	if err := Write(img, o.Out, o.Version); err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("computing the image digest: %w", err)
	}
	return digest, nil
}

// tagText is what a tag may hold; a version that is not one is tagged latest.
var tagText = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Write writes img under out as an OCI layout (oci/) and a tarball tagged
// reaper:VERSION, replacing what was there.
func Write(img v1.Image, out, version string) error {
	dir := filepath.Join(out, LayoutDir)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clearing %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the layout %s: %w", dir, err)
	}
	tag := version
	if !tagText.MatchString(tag) {
		tag = "latest"
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return fmt.Errorf("writing the image into %s: %w", dir, err)
	}
	ref, err := name.NewTag("reaper:" + tag)
	if err != nil {
		return fmt.Errorf("naming the image: %w", err)
	}
	tarPath := filepath.Join(out, TarballName)
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		return fmt.Errorf("writing %s: %w", tarPath, err)
	}
	return nil
}
