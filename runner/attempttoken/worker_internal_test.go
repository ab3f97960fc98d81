package attempttoken

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// A worker token signed before it carried its first mint time counts its
// credential from its own issue: its renewal then carries that time, so
// the ceiling applies from the first claim after the upgrade.
func TestWorkerTokenWithoutAMintTimeCountsFromItsIssue(t *testing.T) {
	kr, err := NewKeyring(Key{ID: "k", Secret: bytes.Repeat([]byte{7}, MinSecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	issued := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	b := binary.BigEndian.AppendUint64(nil, uint64(issued.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(issued.Add(time.Hour).UnixMilli()))
	b = binary.AppendUvarint(b, uint64(len("w")))
	b = append(b, 'w')
	c, err := kr.VerifyWorker(kr.seal(workerPrefix, b), issued.Add(time.Minute))
	if err != nil || c.Worker != "w" || !c.MintedAt.Equal(issued) {
		t.Fatalf("claims %+v, %v: want the worker counted from its issue %s", c, err, issued)
	}
	if _, err := kr.VerifyWorker(kr.seal(workerPrefix, append(b, 1, 2, 3)), issued); err == nil {
		t.Fatal("a worker payload trailed by 3 bytes verified")
	}
}
