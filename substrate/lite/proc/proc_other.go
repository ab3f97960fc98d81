//go:build unix && !linux && !darwin

package proc

import "fmt"

const supported = false

// Stat is not available on this platform.
func Stat(pid int) (Info, error) {
	return Info{}, fmt.Errorf("reading process %d: %w", pid, ErrUnsupported)
}

// BootID is not available on this platform.
func BootID() (string, error) { return "", ErrUnsupported }

// ScanGroups is not available on this platform.
func ScanGroups() (*Groups, error) { return nil, ErrUnsupported }
