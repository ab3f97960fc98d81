//go:build !linux

package agent

func becomeSubreaper() error { return errNoSubreaper }

func sweepDescendants(map[int]bool) (int, error) { return 0, errNoSubreaper }
