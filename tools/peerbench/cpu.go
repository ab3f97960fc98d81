package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the kernel's unit of /proc/stat (USER_HZ), 100 on Linux.
const clockTicks = 100

// machineCPU returns the CPU time the whole machine has spent busy (every
// process, the database's included) since boot, or NaN where /proc/stat
// cannot be read (not Linux).
func machineCPU() float64 {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return math.NaN()
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return math.NaN()
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 8 || fields[0] != "cpu" {
		return math.NaN()
	}
	busy := 0.0
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, s := range fields[1:min(len(fields), 9)] {
		if i == 3 || i == 4 {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return math.NaN()
		}
		busy += v
	}
	return busy / clockTicks
}

// cpuMeasured runs f and returns the machine's CPU time over it (NaN when
// unknown).
func cpuMeasured(f func() error) (float64, error) {
	before := machineCPU()
	err := f()
	return machineCPU() - before, err
}

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
