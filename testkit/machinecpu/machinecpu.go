// Package machinecpu reads the CPU time the whole machine spends busy, from
// /proc/stat: every process counts, the database's and the load
// generator's included, so a benchmark that runs its system on one machine
// can say what a unit of work costs that machine.
package machinecpu

import (
	"bufio"
	"math"
	"os"
	"strconv"
	"strings"
)

// clockTicks is the kernel's unit of /proc/stat (USER_HZ), 100 on Linux.
const clockTicks = 100

// Busy returns the CPU seconds the whole machine has spent busy since
// boot, or NaN where /proc/stat cannot be read (not Linux).
func Busy() float64 {
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

// Measured runs f and returns the machine's CPU seconds over it (NaN when
// unknown).
func Measured(f func() error) (float64, error) {
	before := Busy()
	err := f()
	return Busy() - before, err
}
