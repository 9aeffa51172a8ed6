//go:build !linux

package pagetrim

// Executable is not supported on this operating system: it returns
// ErrUnsupported.
func Executable() (int64, error) { return 0, ErrUnsupported }
