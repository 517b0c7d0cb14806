package sinks

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFileAtomic writes data to path with mode 0600 so that a reader sees
// the old file or the new one, never part of one: a temporary file in the
// same directory, then renamed over path. Watchers of the directory
// (Kueue's MultiKueue, for one) see one rename per write. It does not wait
// for the disk: after a power loss the file may be the old one (or empty),
// which suits files hubsync rewrites from the hub's state when it starts.
func WriteFileAtomic(path string, data []byte) error {
	return writeFile(path, data, false)
}

// WriteFileDurable is WriteFileAtomic that also syncs the file to disk
// before the rename, for data that exists nowhere else (a webhook's spool).
// The directory entry is durable once the caller syncs the directory.
func WriteFileDurable(path string, data []byte) error {
	return writeFile(path, data, true)
}

func writeFile(path string, data []byte, durable bool) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600, which a umask can only narrow.
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// EnsureDir creates dir with mode 0700 if it is missing and tightens an
// existing one to 0700: it holds credentials or configurations that lead to
// them.
func EnsureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}
