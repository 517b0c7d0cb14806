// Command release builds hubsync's release artefacts from a checkout into
// one directory (make release):
//
//   - hubsync-<os>-<arch>: the binary for linux and darwin on amd64 and
//     arm64 (static, -trimpath, stamped with version, commit and the
//     commit's time);
//   - hubsync-<os>-<arch>.cdx.json: each binary's SBOM (CycloneDX JSON),
//     made by cyclonedx-gomod from the module list the Go toolchain
//     recorded in the binary;
//   - image/: the image, an OCI layout holding one index of linux/amd64
//     and linux/arm64, built without a Docker daemon (go-containerregistry);
//     image.txt names it with its digest;
//   - hubsync-<version without v>.tgz: the chart, its version and
//     appVersion the release's, its image.digest the image's;
//   - SHA256SUMS over the binaries, SBOMs and chart.
//
// One commit builds the same artefacts: every time in them is the commit's.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// release is one run's settings.
type release struct {
	root, out             string
	version, commit, date string
	repository            string
	created               time.Time
	stdout                io.Writer
}

// platform is one binary's GOOS/GOARCH.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// binary is the file name of a platform's binary.
func (p platform) binary() string { return "hubsync-" + p.os + "-" + p.arch }

// platforms are the binaries a release holds; the linux ones go into the
// image.
var platforms = []platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}}

// Repository is where the image is published, as the chart names it.
const Repository = "ghcr.io/hubsync/hubsync"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	r, err := parse(args, stdout, stderr)
	if err != nil {
		return err
	}
	return r.build(ctx)
}

func parse(args []string, stdout, stderr io.Writer) (*release, error) {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := &release{stdout: stdout}
	fs.StringVar(&r.root, "root", "../../..", "the hubsync checkout to build")
	fs.StringVar(&r.out, "out", "", "the directory to write the artefacts to (created; must be empty)")
	fs.StringVar(&r.version, "version", "", "the version (vMAJOR.MINOR.PATCH, or git describe's form)")
	fs.StringVar(&r.commit, "commit", "", "the commit built")
	fs.StringVar(&r.date, "date", "", "the commit's time, RFC 3339 (every time in the artefacts)")
	fs.StringVar(&r.repository, "repository", Repository, "the image's repository")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var missing []string
	for name, v := range map[string]string{"out": r.out, "version": r.version, "commit": r.commit, "date": r.date} {
		if v == "" {
			missing = append(missing, "-"+name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("%s required", strings.Join(missing, ", "))
	}
	if !strings.HasPrefix(r.version, "v") {
		return nil, fmt.Errorf("-version %q: want a v-prefixed version", r.version)
	}
	created, err := time.Parse(time.RFC3339, r.date)
	if err != nil {
		return nil, fmt.Errorf("-date: %w", err)
	}
	r.created = created.UTC()
	if r.root, err = filepath.Abs(r.root); err != nil {
		return nil, err
	}
	if r.out, err = filepath.Abs(r.out); err != nil {
		return nil, err
	}
	return r, nil
}

// build makes every artefact into r.out.
func (r *release) build(ctx context.Context) error {
	if err := os.MkdirAll(r.out, 0o755); err != nil {
		return err
	}
	if entries, err := os.ReadDir(r.out); err != nil {
		return err
	} else if len(entries) > 0 {
		return fmt.Errorf("%s is not empty", r.out)
	}
	var files []string
	linux := map[string]string{}
	for _, p := range platforms {
		bin := filepath.Join(r.out, p.binary())
		if err := r.compile(ctx, p, bin); err != nil {
			return err
		}
		sbom := bin + ".cdx.json"
		if err := r.sbom(ctx, bin, sbom); err != nil {
			return err
		}
		files = append(files, bin, sbom)
		if p.os == "linux" {
			linux[p.arch] = bin
		}
		fmt.Fprintf(r.stdout, "built %s and its SBOM\n", p.binary())
	}
	digest, err := r.image(linux, filepath.Join(r.out, "image"))
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	ref := fmt.Sprintf("%s:%s@%s", r.repository, r.version, digest)
	if err := os.WriteFile(filepath.Join(r.out, "image.txt"), []byte(ref+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "image %s (OCI layout in image/)\n", ref)
	chart, err := r.chart(ctx, digest.String())
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	files = append(files, chart)
	fmt.Fprintf(r.stdout, "packaged the chart as %s\n", filepath.Base(chart))
	if err := writeSums(filepath.Join(r.out, "SHA256SUMS"), files); err != nil {
		return err
	}
	fmt.Fprintln(r.stdout, "wrote SHA256SUMS")
	return nil
}

// compile builds one platform's binary as the Makefile builds hubsync.
func (r *release) compile(ctx context.Context, p platform, out string) error {
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s -X main.date=%s", r.version, r.commit, r.date)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", "http2legacy", "-ldflags", ldflags, "-o", out, "./cmd/hubsync")
	cmd.Dir = r.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", p, err, out)
	}
	return nil
}

// chart packages charts/hubsync with the release's version and the
// image's digest (test/chart/cmd/package, in the module that has Helm)
// and returns the archive's path.
func (r *release) chart(ctx context.Context, digest string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "run", "./cmd/package", "-out", r.out, "-version", r.version, "-digest", digest, "-date", r.date)
	cmd.Dir = filepath.Join(r.root, "test", "chart")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// sbom writes bin's SBOM, without a serial number or a timestamp, so
// that one commit's SBOM is the same every time.
func (r *release) sbom(ctx context.Context, bin, out string) error {
	// cyclonedx-gomod is this module's tool (go.mod), at its pinned version.
	cmd := exec.CommandContext(ctx, "go", "tool", "cyclonedx-gomod", "bin", "-json", "-noserial", "-notimestamp", "-version", r.version, "-output", out, bin)
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("SBOM of %s: %w\n%s", filepath.Base(bin), err, o)
	}
	return nil
}

// writeSums writes files' SHA-256 sums as sha256sum prints them, with
// the files' base names.
func writeSums(path string, files []string) error {
	var b strings.Builder
	for _, f := range files {
		sum, err := fileSum(f)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, filepath.Base(f))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
