// Command package writes the chart as a release carries it (make release):
// charts/hubsync with the release's version as its version and
// appVersion, and the image's digest in its values, as
// hubsync-<version>.tgz. Every file in it is timed at the commit, so one
// commit packages the same file.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/hubsync/hubsync/test/chart"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "package: %v\n", err)
		os.Exit(1)
	}
}

// digestLine is the values.yaml line the image's digest goes into.
var digestLine = regexp.MustCompile(`(?m)^  digest: ""$`)

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

func run(args []string) error {
	fs := flag.NewFlagSet("package", flag.ContinueOnError)
	out := fs.String("out", "", "the directory to write the chart's archive into")
	version := fs.String("version", "", "the release's version (v-prefixed)")
	digest := fs.String("digest", "", "the image index's digest (sha256:...)")
	date := fs.String("date", "", "the commit's time, RFC 3339")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || !strings.HasPrefix(*version, "v") || !digestRE.MatchString(*digest) {
		return errors.New("usage: package -out DIR -version vX.Y.Z -digest sha256:... -date RFC3339")
	}
	mtime, err := time.Parse(time.RFC3339, *date)
	if err != nil {
		return fmt.Errorf("-date: %w", err)
	}
	ch, err := chart.LoadCheckout()
	if err != nil {
		return err
	}
	v := strings.TrimPrefix(*version, "v")
	ch.Metadata.Version, ch.Metadata.AppVersion = v, v
	found := false
	for _, f := range ch.Raw {
		if f.Name == chartutil.ValuesfileName {
			if len(digestLine.FindAllIndex(f.Data, -1)) != 1 {
				return fmt.Errorf("%s has no single line `  digest: \"\"` (image.digest) to set", f.Name)
			}
			f.Data = digestLine.ReplaceAll(f.Data, []byte(`  digest: "`+*digest+`"`))
			found = true
		}
	}
	if !found {
		return errors.New("the chart has no values.yaml")
	}
	if img, ok := ch.Values["image"].(map[string]any); ok {
		img["digest"] = *digest
	}
	tmp, err := os.MkdirTemp("", "hubsync-chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	saved, err := chartutil.Save(ch, tmp)
	if err != nil {
		return err
	}
	dst := filepath.Join(*out, filepath.Base(saved))
	if err := retime(saved, dst, mtime.UTC()); err != nil {
		return err
	}
	fmt.Println(dst)
	return nil
}

// retime copies the gzipped tar src to dst with every entry timed at t
// and no time in the gzip header (Helm times them at the moment it saves).
func retime(src, dst string, t time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = t, time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}
