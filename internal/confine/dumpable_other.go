//go:build !linux

package confine

// Undumpable is Linux's only; elsewhere it does nothing.
func Undumpable() error { return nil }

// ClearInheritable is Linux's only; elsewhere it does nothing.
func ClearInheritable() (restore func() error, err error) { return func() error { return nil }, nil }

// NoNewPrivs is Linux's only; elsewhere it does nothing.
func NoNewPrivs() error { return nil }

// LandlockABI: no Landlock outside Linux.
func LandlockABI() (int, error) { return 0, ErrNoLandlock }

// HideFiles: no Landlock outside Linux.
func HideFiles([]string) error { return ErrNoLandlock }

// AsUser runs fn as it is: outside Linux a thread has no user of its own.
func AsUser(_ uint32, fn func() error) error { return fn() }
