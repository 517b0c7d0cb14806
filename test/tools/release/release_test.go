package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestRelease builds a release of this checkout as `make release` does and
// checks it as its user would, without Docker: the checksums, each
// binary's version and SBOM, and the image read from its OCI layout (its
// platforms, user, entrypoint, labels, and the binary in its layer).
func TestRelease(t *testing.T) {
	out := t.TempDir()
	const version, commit, date = "v9.8.7", "0123456789abcdef0123456789abcdef01234567", "2026-11-29T04:19:18Z"
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"-root", "../../..", "-out", out, "-version", version, "-commit", commit, "-date", date}, &stdout, os.Stderr); err != nil {
		t.Fatal(err)
	}
	t.Log(stdout.String())

	t.Run("checksums", func(t *testing.T) { checkSums(t, out) })
	for _, p := range platforms {
		bin := filepath.Join(out, p.binary())
		t.Run(p.String(), func(t *testing.T) {
			info, err := buildinfo.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			// (-trimpath leaves -ldflags out of the record: the version is
			// checked by running the binary.)
			if settings["GOOS"] != p.os || settings["GOARCH"] != p.arch || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" || settings["-tags"] != "http2legacy" {
				t.Errorf("build settings %v", settings)
			}
			checkSBOM(t, bin+".cdx.json", info, version)
			if p.os == runtime.GOOS && p.arch == runtime.GOARCH {
				checkVersion(t, bin, version, commit, date)
			}
		})
	}
	t.Run("image", func(t *testing.T) { checkImage(t, out, version, commit, date) })
	t.Run("chart", func(t *testing.T) { checkChart(t, out, version) })
	t.Run("reproducible", func(t *testing.T) {
		again := t.TempDir()
		if err := run(t.Context(), []string{"-root", "../../..", "-out", again, "-version", version, "-commit", commit, "-date", date}, io.Discard, os.Stderr); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"SHA256SUMS", "image.txt"} {
			a, _ := os.ReadFile(filepath.Join(out, f))
			b, _ := os.ReadFile(filepath.Join(again, f))
			if len(a) == 0 || !bytes.Equal(a, b) {
				t.Errorf("%s differs between two builds of one commit:\n%s\n%s", f, a, b)
			}
		}
	})
}

// checkSums verifies SHA256SUMS as `sha256sum -c` would.
func checkSums(t *testing.T, dir string) {
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("line %q", sc.Text())
		}
		got, err := fileSum(filepath.Join(dir, name))
		if err != nil || got != sum {
			t.Errorf("%s: sum %s (%v); SHA256SUMS says %s", name, got, err, sum)
		}
		names = append(names, name)
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, ".tgz") }) {
		t.Errorf("SHA256SUMS lacks the chart")
	}
	for _, p := range platforms {
		for _, want := range []string{p.binary(), p.binary() + ".cdx.json"} {
			if !slices.Contains(names, want) {
				t.Errorf("SHA256SUMS lacks %s", want)
			}
		}
	}
}

// checkSBOM: the SBOM names the binary at the release's version and lists
// every module the Go toolchain recorded in it, at its version.
func checkSBOM(t *testing.T, path string, info *buildinfo.BuildInfo, version string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat string `json:"bomFormat"`
		Metadata  struct {
			Component struct{ Name, Version string } `json:"component"`
		} `json:"metadata"`
		Components []struct{ Name, Version string } `json:"components"`
	}
	if err := json.Unmarshal(data, &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Version != version {
		t.Errorf("SBOM %s: format %q, component %+v", filepath.Base(path), bom.BOMFormat, bom.Metadata.Component)
	}
	have := map[string]string{}
	for _, c := range bom.Components {
		have[c.Name] = c.Version
	}
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		if v, ok := have[d.Path]; !ok || v != m.Version {
			t.Errorf("SBOM %s: module %s at %q; the binary holds %s", filepath.Base(path), d.Path, v, m.Version)
		}
	}
	if len(info.Deps) < 50 {
		t.Errorf("the binary records only %d modules", len(info.Deps))
	}
}

// checkVersion runs the binary as a user would to see what it is.
func checkVersion(t *testing.T, bin, version, commit, date string) {
	t.Helper()
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if v["gitVersion"] != version || v["gitCommit"] != commit || v["buildDate"] != date {
		t.Errorf("hubsync version: %s", out)
	}
}

// checkImage reads the OCI layout and checks the image a cluster would
// pull: one index for linux/amd64 and linux/arm64, each running
// /hubsync as the nonroot user with the OCI labels, its layer holding
// the release's linux binary, not writable by that user.
func checkImage(t *testing.T, out, version, commit, date string) {
	ref, err := os.ReadFile(filepath.Join(out, "image.txt"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(filepath.Join(out, "image"))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("layout index: %v, %+v", err, im)
	}
	top := im.Manifests[0]
	if !strings.HasSuffix(strings.TrimSpace(string(ref)), ":"+version+"@"+top.Digest.String()) || !strings.HasPrefix(string(ref), Repository+":") {
		t.Errorf("image.txt %q; the layout's index is %s", ref, top.Digest)
	}
	if top.Annotations["org.opencontainers.image.ref.name"] != version {
		t.Errorf("layout annotations %v", top.Annotations)
	}
	multi, err := idx.ImageIndex(top.Digest)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var arches []string
	for _, d := range mm.Manifests {
		if d.Platform == nil || d.Platform.OS != "linux" {
			t.Fatalf("manifest %s for platform %v", d.Digest, d.Platform)
		}
		arches = append(arches, d.Platform.Architecture)
		img, err := multi.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkPlatformImage(t, img, d.Platform.Architecture, filepath.Join(out, "hubsync-linux-"+d.Platform.Architecture), version, commit, date)
	}
	if !slices.Equal(arches, []string{"amd64", "arm64"}) {
		t.Errorf("platforms %v; want amd64 and arm64", arches)
	}
}

func checkPlatformImage(t *testing.T, img v1.Image, arch, bin, version, commit, date string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != arch || c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/hubsync"}) ||
		!slices.Equal(c.Cmd, []string{"run", "--config", "/etc/hubsync/config.yaml"}) {
		t.Errorf("linux/%s config: os %s arch %s user %q entrypoint %v cmd %v", arch, cf.OS, cf.Architecture, c.User, c.Entrypoint, c.Cmd)
	}
	for k, want := range map[string]string{"org.opencontainers.image.version": version, "org.opencontainers.image.revision": commit,
		"org.opencontainers.image.created": date, "org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.source": "https://github.com/hubsync/hubsync"} {
		if c.Labels[k] != want {
			t.Errorf("linux/%s label %s = %q; want %q", arch, k, c.Labels[k], want)
		}
	}
	if got := cf.Created.UTC().Format("2006-01-02T15:04:05Z"); got != date {
		t.Errorf("linux/%s created %s; want the commit's time %s", arch, got, date)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("linux/%s: %d layers (%v); want 1", arch, len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	headers, files := readTar(t, rc)
	for _, h := range headers {
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("linux/%s: %s owned by %d:%d; want root", arch, h.Name, h.Uid, h.Gid)
		}
		if h.Name == "hubsync" && h.Mode != 0o755 {
			t.Errorf("linux/%s: /hubsync has mode %o", arch, h.Mode)
		}
	}
	if got, ok := files["hubsync"]; !ok || !bytes.Equal(got, want) {
		t.Errorf("linux/%s: /hubsync in the layer is not the release's binary", arch)
	}
}

// readTar reads every entry of a tar stream: the headers in order and
// each file's content by name.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var headers []*tar.Header
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers, files
		}
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, h)
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
}

// checkChart: the packaged chart carries the release's version and the
// image's digest.
func checkChart(t *testing.T, out, version string) {
	ref, err := os.ReadFile(filepath.Join(out, "image.txt"))
	if err != nil {
		t.Fatal(err)
	}
	_, digest, _ := strings.Cut(strings.TrimSpace(string(ref)), "@")
	v := strings.TrimPrefix(version, "v")
	f, err := os.Open(filepath.Join(out, "hubsync-"+v+".tgz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	_, raw := readTar(t, zr)
	files := map[string]string{}
	for name, data := range raw {
		files[name] = string(data)
	}
	if c := files["hubsync/Chart.yaml"]; !strings.Contains(c, "\nversion: "+v+"\n") || !strings.Contains(c, "\nappVersion: "+v+"\n") {
		t.Errorf("Chart.yaml:\n%s", c)
	}
	if vals := files["hubsync/values.yaml"]; !strings.Contains(vals, `  digest: "`+digest+`"`) {
		t.Errorf("values.yaml does not carry the image's digest %s", digest)
	}
	for _, want := range []string{"hubsync/values.schema.json", "hubsync/templates/statefulset.yaml"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the chart lacks %s", want)
		}
	}
}
