package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// pluginDir is where every recipe puts the plugin in a consumer's pod: an
// emptyDir mounted there, filled by an init container of hubsync's image
// running `hubsync install /plugins`.
const pluginDir = "/plugins"

// installCommand copies this binary into a directory: hubsync's image has
// no shell and no cp, so an init container of it hands `hubsync creds` to
// a consumer's pod (Argo CD, Kueue, a multicluster-runtime controller)
// through a shared volume this way. The copy is written beside its final
// name and renamed, so that a reader never runs half a binary.
func installCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "hubsync", "the file's name in DIR")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hubsync install [--name hubsync] DIR\n\nCopies this binary to DIR/NAME (mode 0755), for an exec plugin in another pod; recipes use DIR %s.\n", pluginDir)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *name == "" || strings.ContainsRune(*name, '/') || *name == "." || *name == ".." {
		fs.Usage()
		return errUsage
	}
	dir := fs.Arg(0)
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	dst := filepath.Join(dir, *name)
	if err := copyExecutable(self, dst); err != nil {
		return err
	}
	b := build()
	_, err = fmt.Fprintf(stdout, "installed hubsync %s (%s) as %s\n", b.Version, b.Commit, dst)
	return err
}

// copyExecutable copies src to dst, mode 0755, through a temporary file
// in dst's directory renamed into place.
func copyExecutable(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("read this binary: %w", err)
	}
	defer in.Close()
	dir := filepath.Dir(dst)
	switch fi, err := os.Stat(dir); {
	case err != nil:
		return fmt.Errorf("install into %s: %w (mount a volume there, e.g. an emptyDir)", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("install into %s: not a directory", dir)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".*")
	if err != nil {
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, in); err == nil {
		err = tmp.Chmod(0o755)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	return nil
}
