//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package webhook

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive lock on the spool directory, so that two
// sinks (of this process, across a careless reload, or of two processes)
// never send and remove the same segments. The kernel drops the lock when
// its holder dies, so a crash leaves no stale lock behind.
func lockDir(dir string) (release func() error, err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open spool lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("spool directory %s is in use by another webhook sink", dir)
		}
		return nil, fmt.Errorf("lock spool directory %s: %w", dir, err)
	}
	// Closing the file releases the lock.
	return f.Close, nil
}
