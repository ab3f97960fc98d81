package board

import (
	"strings"
	"testing"
)

func TestParseFloor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sql      string
		floor    int
		additive bool
		err      string
	}{
		{sql: "-- reaper: additive\nCREATE INDEX x ON y (z);", additive: true},
		{sql: "-- reaper: floor=20\r\nALTER TABLE y DROP COLUMN z;", floor: 20},
		{sql: "--   reaper:   floor=7  \n", floor: 7, err: "first line"},
		{sql: "-- reaper: floor=19\n", floor: 19},
		{sql: "-- reaper: floor=21\n", err: "between 1 and"},
		{sql: "-- reaper: floor=0\n", err: "between 1 and"},
		{sql: "-- reaper: floor=x\n", err: "want -- reaper: additive"},
		{sql: "-- reaper: breaking\n", err: "want -- reaper: additive"},
		{sql: "-- A comment first.\n-- reaper: additive\n", err: "first line"},
		{sql: "", err: "first line"},
	} {
		floor, additive, err := parseFloor(20, tc.sql)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error naming %q", tc.sql, err, tc.err)
		case tc.err == "" && (err != nil || floor != tc.floor || additive != tc.additive):
			t.Errorf("%q: floor %d additive %v (%v), want %d %v", tc.sql, floor, additive, err, tc.floor, tc.additive)
		}
	}
}
