package helmrelease

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// ImageOptions say which product image to build.
type ImageOptions struct {
	// Version is stamped into the binaries and tags the image
	// ImageRepository:Version.
	Version string
	// Tags are the binaries' build tags (the upgrade's probe migration).
	Tags string
	// Progress, when set, gets a line every ProgressEvery while the build
	// runs (a cold build compiles every command: minutes on two cores).
	Progress io.Writer
}

// ProgressEvery is how often a long build says it is still going.
const ProgressEvery = 15 * time.Second

// BuildImage builds the product's image with tools/image, as make image
// does, into out, and returns the path of its tarball.
func BuildImage(ctx context.Context, root, out string, o ImageOptions) (string, error) {
	args := []string{"run", ".", "-root", "../..", "-out", out, "-version", o.Version}
	if o.Tags != "" {
		args = append(args, "-tags", o.Tags)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(root, "tools", "image")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	stop := Progress(o.Progress, "building the image "+ImageRepository+":"+o.Version)
	b, err := cmd.CombinedOutput()
	stop()
	if err != nil {
		return "", fmt.Errorf("helmrelease: build the image %s: %w\n%s", o.Version, err, b)
	}
	return filepath.Join(out, "reaper.tar"), nil
}

// ImportImage builds the product's image (BuildImage, into Dir) and
// imports it into the node's containerd, where the chart's pods find it
// as pulled.
func (r *Release) ImportImage(ctx context.Context, o ImageOptions) error {
	begin := time.Now()
	tar, err := BuildImage(ctx, r.cfg.Root, filepath.Join(r.cfg.Dir, "image-"+o.Version), o)
	if err != nil {
		return err
	}
	built := since(begin)
	begin = time.Now()
	if err := r.Node.ImportArchive(ctx, tar); err != nil {
		return err
	}
	r.say("image %s:%s built by tools/image in %s, imported into the node's containerd in %s",
		ImageRepository, o.Version, built, since(begin))
	return nil
}

// BuildStatic builds the package pkg (relative to root, or an import path)
// as a static Linux executable at out (a task image has no libc).
func BuildStatic(ctx context.Context, root, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("helmrelease: build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// Progress writes "  what ... <time since>" to w every ProgressEvery until
// the returned stop is called (nothing when w is nil): for a step that
// says nothing for minutes.
func Progress(w io.Writer, what string) (stop func()) {
	if w == nil {
		return func() {}
	}
	begin := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(ProgressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintf(w, "  %s ... %s\n", what, time.Since(begin).Round(time.Second))
			}
		}
	}()
	return func() { close(done); <-finished }
}
