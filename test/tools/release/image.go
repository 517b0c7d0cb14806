package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var errNoLinux = errors.New("no linux binary to put in the image")

// The image's user: distroless's nonroot, numeric so that Kubernetes'
// runAsNonRoot can check it without a passwd lookup.
const (
	imageUser = "65532:65532"
	uid       = 65532
)

// imageCmd is what the image runs: the daemon with the configuration the
// chart mounts.
var imageCmd = []string{"run", "--config", "/etc/hubsync/config.yaml"}

// image writes the OCI layout of the image to dir, one manifest per linux
// binary (arch → path), and returns the index's digest.
//
// There is no base image: the layer holds hubsync's static binary, a
// passwd and group naming the nonroot user, and /tmp. The binary carries
// its own CA roots (golang.org/x/crypto/x509roots/fallback) and needs
// nothing else, so there is nothing of anyone else's to pin or patch.
func (r *release) image(linux map[string]string, dir string) (v1.Hash, error) {
	if len(linux) == 0 {
		return v1.Hash{}, errNoLinux
	}
	arches := make([]string, 0, len(linux))
	for a := range linux {
		arches = append(arches, a)
	}
	slices.Sort(arches)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range arches {
		img, err := r.platformImage(arch, linux[arch])
		if err != nil {
			return v1.Hash{}, fmt.Errorf("linux/%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	idx = mutate.Annotations(idx, r.labels()).(v1.ImageIndex)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": r.version,
	})); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

// labels are the OCI annotation keys, set as the image's labels and the
// index's annotations.
func (r *release) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "hubsync",
		"org.opencontainers.image.description": "Event-driven credential and topology sync for Open Cluster Management hubs",
		"org.opencontainers.image.source":      "https://github.com/hubsync/hubsync",
		"org.opencontainers.image.url":         "https://github.com/hubsync/hubsync",
		"org.opencontainers.image.documentation": "https://github.com/hubsync/hubsync/tree/" +
			r.commit + "/docs",
		"org.opencontainers.image.version":  r.version,
		"org.opencontainers.image.revision": r.commit,
		"org.opencontainers.image.created":  r.created.Format(time.RFC3339),
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// platformImage is one architecture's image.
func (r *release) platformImage(arch, bin string) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	content, err := r.rootfs(data)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: r.created}, CreatedBy: "hubsync release " + r.version, Comment: "hubsync, passwd, group, /tmp",
	}}); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: r.created}
	cf.Config = v1.Config{
		User:       imageUser,
		Entrypoint: []string{"/hubsync"},
		Cmd:        imageCmd,
		WorkingDir: "/",
		Env:        []string{"PATH=/"},
		Labels:     r.labels(),
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer's tar: every entry owned by root (the binary is
// not writable by the user that runs it), timed at the commit.
func (r *release) rootfs(binary []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		hdr  tar.Header
		data []byte
	}{
		{tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644},
			[]byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid))},
		{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
			[]byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid))},
		{tar.Header{Name: "hubsync", Typeflag: tar.TypeReg, Mode: 0o755}, binary},
		{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil},
	}
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.data))
		h.ModTime = r.created
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
