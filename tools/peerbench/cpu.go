package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// cpuCells formats the machine's CPU per row and the cores it kept busy
// over the system's work, "–" when unknown.
func cpuCells(n int, cpu float64, work time.Duration) (perRow, cores string) {
	if math.IsNaN(cpu) || n == 0 || work <= 0 {
		return "–", "–"
	}
	return fmt.Sprintf("%.1f", cpu*1e6/float64(n)), fmt.Sprintf("%.2f", cpu/work.Seconds())
}

// medianCPU is the median of the runs' CPU times.
func medianCPU(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
