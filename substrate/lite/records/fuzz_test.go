package records

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
)

// FuzzParse feeds arbitrary bytes to both record parsers. Neither may panic;
// every failure must be ErrGarbled; an accepted record must name process ids
// above 1 and encode back to exactly the bytes it came from (one record, one
// encoding), so no two files can mean the same thing.
func FuzzParse(f *testing.F) {
	f.Add(sampleAgent().Marshal())
	f.Add(sampleGroup().Marshal())
	f.Add([]byte("dexaflow-lite-record 1 pid\nrun=r\ntask=t\ntry=1\nepoch=0\npid=1\nstart=0\nboot=\ncrc=00000000\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkParse(t, data)
		// The checksum stops almost every mutation at the door; seal the
		// input as it is so the field parser gets fuzzed too.
		body := bytes.Clone(data)
		if len(body) > 0 && body[len(body)-1] != '\n' {
			body = append(body, '\n')
		}
		checkParse(t, append(body, fmt.Sprintf("crc=%08x\n", crc32.ChecksumIEEE(body))...))
	})
}

func checkParse(t *testing.T, data []byte) {
	t.Helper()
	a, _ := ParseAgent(data)
	g, _ := ParseGroup(data)
	checkLikely(t, data, likely{}, likely{attempt: a.Attempt, boot: a.Boot}, likely{attempt: g.Attempt, boot: g.Boot},
		likely{attempt: sampleGroup().Attempt, boot: sampleGroup().Boot})
	if a, err := ParseAgent(data); err == nil {
		if a.PID <= 1 {
			t.Fatalf("accepted agent pid %d", a.PID)
		}
		if !bytes.Equal(a.Marshal(), data) {
			t.Fatalf("agent record does not re-encode to its input:\n%q\n%q", data, a.Marshal())
		}
	} else if !errors.Is(err, ErrGarbled) {
		t.Fatalf("agent parse error is not ErrGarbled: %v", err)
	}
	if g, err := ParseGroup(data); err == nil {
		if g.PGID <= 1 || g.AgentPID <= 1 || g.LeaderStart == 0 {
			t.Fatalf("accepted group record %+v", g)
		}
		if !bytes.Equal(g.Marshal(), data) {
			t.Fatalf("group record does not re-encode to its input:\n%q\n%q", data, g.Marshal())
		}
	} else if !errors.Is(err, ErrGarbled) {
		t.Fatalf("group parse error is not ErrGarbled: %v", err)
	}
}
