package ctl

import (
	"sort"
	"time"
)

// The arithmetic of tune. Percentiles are by nearest rank: the p-th
// percentile of n samples is the smallest sample with at least p percent of
// the samples at or below it, so it is always an observed value and never
// under-reports a tail (with fewer than 1000 samples, p99.9 is the maximum).

// suggestionFactor is the pattern's multiple of the median: a TTL about ten
// times the median task survives every honest task.
const suggestionFactor = 10

// summary describes one sample of durations.
type summary struct {
	Count  int
	Median time.Duration
	P99    time.Duration
	P999   time.Duration
	Max    time.Duration
}

// summarize computes a summary; samples is not modified.
func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	sorted := append([]time.Duration(nil), samples...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	return summary{
		Count:  len(sorted),
		Median: nearestRank(sorted, 500),
		P99:    nearestRank(sorted, 990),
		P999:   nearestRank(sorted, 999),
		Max:    sorted[len(sorted)-1],
	}
}

// nearestRank returns the permille-th per-mille of sorted (500: the
// median), in integers so that no rounding of a float moves the rank.
func nearestRank(sorted []time.Duration, permille int) time.Duration {
	n := len(sorted)
	rank := (permille*n + 999) / 1000 // ceil(permille * n / 1000)
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// suggest is the threshold the orphan-reaper pattern suggests for a
// summary: about ten times the median, never under the observed tail
// (p99.9), rounded up to a step that suits its size.
func suggest(s summary) time.Duration {
	d := suggestionFactor * s.Median
	if s.P999 > d {
		d = s.P999
	}
	return roundUp(d)
}

// roundUp rounds d up to a step that suits its size: 10ms under a second,
// a second under a minute, 10s under ten minutes, a minute under an hour,
// then 10 minutes.
func roundUp(d time.Duration) time.Duration {
	var step time.Duration
	switch {
	case d <= 0:
		return 0
	case d < time.Second:
		step = 10 * time.Millisecond
	case d < time.Minute:
		step = time.Second
	case d < 10*time.Minute:
		step = 10 * time.Second
	case d < time.Hour:
		step = time.Minute
	default:
		step = 10 * time.Minute
	}
	return (d + step - 1) / step * step
}
