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

// Process returns the CPU seconds the process pid and its children have
// spent: its own, that of its children it has waited for, and that of its
// children still running (a database server's backends). NaN when
// /proc/<pid>/stat cannot be read.
func Process(pid int) float64 {
	own, ok := procTimes(pid, true)
	if !ok {
		return math.NaN()
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return own
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if ppid, ok := procParent(child); ok && ppid == pid {
			if t, ok := procTimes(child, false); ok {
				own += t
			}
		}
	}
	return own
}

// Own returns the CPU seconds the process pid has spent itself, its
// children's left out (a benchmark that starts its load generator as a
// child counts the two apart). NaN when /proc/<pid>/stat cannot be read.
func Own(pid int) float64 {
	t, ok := procTimes(pid, false)
	if !ok {
		return math.NaN()
	}
	return t
}

// procFields are the fields of /proc/<pid>/stat after the command name
// (whose parentheses may hold spaces): field 4 (ppid) is the second.
func procFields(pid int) ([]string, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	f := strings.Fields(s[i+1:])
	return f, len(f) >= 15
}

func procParent(pid int) (int, bool) {
	f, ok := procFields(pid)
	if !ok {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// procTimes is utime + stime (fields 14, 15), and with waited cutime +
// cstime (16, 17), in seconds.
func procTimes(pid int, waited bool) (float64, bool) {
	f, ok := procFields(pid)
	if !ok {
		return 0, false
	}
	n := 2
	if waited {
		n = 4
	}
	t := 0.0
	for _, s := range f[11 : 11+n] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, false
		}
		t += v
	}
	return t / clockTicks, true
}
