//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package webhook

// lockDir does nothing where flock is not available: hubsync runs on
// Linux, and two sinks sharing a spool directory are refused there.
func lockDir(string) (func() error, error) {
	return func() error { return nil }, nil
}
