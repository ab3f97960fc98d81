package board_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// TestTheAuditsEvidenceReadsInSQL: reap_evidence (migration 015) reads the
// board's packed evidence as the board does, every key code included (so a
// key appended to the Go list without a migration that teaches it to SQL
// fails here), a key spelled out and values that need escaping; a value
// that is not UTF-8 reads in encode's escape form; a row written before
// the packed form reads its jsonb; a packed evidence cut short is refused,
// never read as some other evidence.
func TestTheAuditsEvidenceReadsInSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	ev := map[string]string{"own_key": "spelled out", "quoted": `say "hi" \ back`,
		"control": "tab\there\nnew line\x01", "unicode": "café ☕", "": "empty key"}
	for i, k := range board.PackedKeys() {
		ev[k] = k + " value " + string(rune('a'+i%26))
	}
	read := func(packed []byte, plain any) (map[string]string, error) {
		var out map[string]string
		var raw []byte
		err := pool.QueryRow(ctx, `SELECT reap_evidence($1::bytea, $2::jsonb)::text`, packed, plain).Scan(&raw)
		if err == nil {
			err = json.Unmarshal(raw, &out)
		}
		return out, err
	}
	got, err := read(board.PackEvidence(ev), nil)
	if err != nil || !maps.Equal(got, ev) {
		t.Fatalf("packed evidence reads in SQL as %q (%v), want %q", got, err, ev)
	}
	got, err = read(board.PackEvidence(map[string]string{"term": "bad\xffbyte"}), nil)
	if err != nil || got["term"] != `bad\377byte` {
		t.Fatalf("a value that is not UTF-8 reads as %q (%v), want the escape form", got, err)
	}
	got, err = read(nil, `{"term": "3"}`)
	if err != nil || !maps.Equal(got, map[string]string{"term": "3"}) {
		t.Fatalf("a row from before the packed form reads as %q (%v)", got, err)
	}
	good := board.PackEvidence(map[string]string{"term": "7"})
	for name, b := range map[string][]byte{"cut short": good[:len(good)-1], "other format": append([]byte{2}, good[1:]...),
		"length past": {1, 1, 9, 'x'}} {
		if got, err := read(b, nil); err == nil {
			t.Errorf("%s: %q read in SQL as %q", name, b, got)
		}
	}
}
