//go:build linux

package proc

import "testing"

func TestParseStatOddCommand(t *testing.T) {
	line := "4242 (a) b (c) Z 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n"
	info, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != 4242 || info.PPID != 1 || info.PGID != 4242 || info.Start != 778 || !info.Zombie {
		t.Fatalf("parseStat = %+v", info)
	}
	// A leader that exited while other threads run on is not a zombie.
	info, _ = parseStat([]byte("7 (x) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0 9 0 0\n"))
	if info.Zombie {
		t.Fatal("a thread group with live threads read as a zombie")
	}
	for _, bad := range []string{"", "12 (x", "x (y) S 1 2", "12 (x) S 1 2 3\n"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}
