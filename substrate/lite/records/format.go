package records

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"strings"

	"github.com/dexaflow/reaper/sdk"
)

// ErrGarbled marks a record that cannot be trusted: truncated, corrupted,
// naming another attempt, or naming a PID or group id of 1 or less. Such a
// record reads unknown and its numbers are never signalled.
var ErrGarbled = errors.New("garbled record")

// MaxRecordSize bounds a record file; a longer file is garbled.
const MaxRecordSize = 4096

// Record kinds, the third word of a record's first line.
const (
	KindAgent = "pid"
	KindGroup = "pgid"
)

const (
	magic   = "dexaflow-lite-record"
	version = "1"
)

// AgentRecord is the .pid record: written by the spawner once the agent
// process exists and before the agent may start the task.
type AgentRecord struct {
	Attempt sdk.Attempt
	// PID is the agent's process id (> 1).
	PID int
	// Start is the agent's start time (proc.Info.Start); 0 when it could not
	// be read, and then only signal 0 judges the agent.
	Start uint64
	// Boot names the host boot the record was written in; "" when unknown.
	Boot string
}

// GroupRecord is the .pgid record: written by the agent as soon as it has
// started the task as the leader of its own process group.
type GroupRecord struct {
	Attempt sdk.Attempt
	// PGID is the task's process group id, which is its leader's PID (> 1).
	PGID int
	// AgentPID is the PID of the agent that started the group (> 1).
	AgentPID int
	// AgentStart is that agent's start time; 0 when it could not be read.
	// With it the group record alone judges the attempt, so a running
	// attempt costs one record read.
	AgentStart uint64
	// LeaderStart is the group leader's start time (> 0).
	LeaderStart uint64
	// Boot names the host boot the record was written in; "" when unknown.
	Boot string
}

// Marshal encodes the record. The format is line-oriented text:
//
//	dexaflow-lite-record 1 pid
//	run=<escaped run id>
//	task=<escaped task id>
//	try=<int>
//	epoch=<int>
//	pid=<int>
//	start=<uint>
//	boot=<escaped>
//	crc=<crc32 (IEEE) of every byte above this line, 8 hex digits>
//
// Ids are percent-escaped (see Escape) so no value can hold a newline. The
// closing checksum line makes a truncated or altered record detectable.
func (r AgentRecord) Marshal() []byte {
	return seal(KindAgent, r.Attempt, [][2]string{
		{"pid", strconv.Itoa(r.PID)},
		{"start", strconv.FormatUint(r.Start, 10)},
		{"boot", Escape(r.Boot)},
	})
}

// Marshal encodes the record in the format of AgentRecord.Marshal, with the
// kind "pgid" and the keys pgid, agent_pid, agent_start, leader_start and
// boot.
func (r GroupRecord) Marshal() []byte {
	return seal(KindGroup, r.Attempt, [][2]string{
		{"pgid", strconv.Itoa(r.PGID)},
		{"agent_pid", strconv.Itoa(r.AgentPID)},
		{"agent_start", strconv.FormatUint(r.AgentStart, 10)},
		{"leader_start", strconv.FormatUint(r.LeaderStart, 10)},
		{"boot", Escape(r.Boot)},
	})
}

func seal(kind string, a sdk.Attempt, kv [][2]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %s\n", magic, version, kind)
	fmt.Fprintf(&b, "run=%s\ntask=%s\ntry=%d\nepoch=%d\n", Escape(a.RunID), Escape(a.TaskID), a.Try, a.Epoch)
	for _, p := range kv {
		fmt.Fprintf(&b, "%s=%s\n", p[0], p[1])
	}
	fmt.Fprintf(&b, "crc=%08x\n", crc32.ChecksumIEEE(b.Bytes()))
	return b.Bytes()
}

// ParseAgent decodes a .pid record. Every failure wraps ErrGarbled.
func ParseAgent(data []byte) (AgentRecord, error) {
	return parseAgent(data, likely{})
}

// likely holds strings a reader expects a record to hold: the attempt it
// asked for, the boot id of the records read before. A value that encodes
// one of them exactly is decoded to that string instead of a new copy; any
// other value is decoded as usual. Nothing is assumed: every byte is checked.
type likely struct {
	attempt sdk.Attempt
	boot    string
}

func parseAgent(data []byte, like likely) (AgentRecord, error) {
	f, err := open(data, KindAgent, like.attempt)
	if err != nil {
		return AgentRecord{}, err
	}
	r := AgentRecord{Attempt: f.attempt}
	if r.PID, err = f.pid("pid"); err != nil {
		return AgentRecord{}, err
	}
	if r.Start, err = f.uint("start"); err != nil {
		return AgentRecord{}, err
	}
	if r.Boot, err = f.textLike("boot", like.boot); err != nil {
		return AgentRecord{}, err
	}
	return r, nil
}

// ParseGroup decodes a .pgid record. Every failure wraps ErrGarbled.
func ParseGroup(data []byte) (GroupRecord, error) {
	return parseGroup(data, likely{})
}

func parseGroup(data []byte, like likely) (GroupRecord, error) {
	f, err := open(data, KindGroup, like.attempt)
	if err != nil {
		return GroupRecord{}, err
	}
	r := GroupRecord{Attempt: f.attempt}
	if r.PGID, err = f.pid("pgid"); err != nil {
		return GroupRecord{}, err
	}
	if r.AgentPID, err = f.pid("agent_pid"); err != nil {
		return GroupRecord{}, err
	}
	if r.AgentStart, err = f.uint("agent_start"); err != nil {
		return GroupRecord{}, err
	}
	if r.LeaderStart, err = f.uint("leader_start"); err != nil {
		return GroupRecord{}, err
	}
	if r.LeaderStart == 0 {
		return GroupRecord{}, garbled("leader_start is 0")
	}
	if r.Boot, err = f.textLike("boot", like.boot); err != nil {
		return GroupRecord{}, err
	}
	return r, nil
}

func garbled(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrGarbled, fmt.Sprintf(format, args...))
}

type fields struct {
	attempt sdk.Attempt
	keys    []string  // keysOf(kind)
	values  [9][]byte // in the order of keys; as many as the longest kind has
}

// The keys of each kind of record, in the order Marshal writes them.
var (
	agentKeys = []string{"run", "task", "try", "epoch", "pid", "start", "boot"}
	groupKeys = []string{"run", "task", "try", "epoch", "pgid", "agent_pid", "agent_start", "leader_start", "boot"}
)

// keysOf lists a record kind's keys in the order Marshal writes them.
func keysOf(kind string) []string {
	if kind == KindAgent {
		return agentKeys
	}
	return groupKeys
}

// open checks the header, the checksum and the keys (each once, in the
// order Marshal writes them), and decodes the attempt (reusing the strings
// of like where the record holds exactly them).
func open(data []byte, kind string, like sdk.Attempt) (fields, error) {
	if len(data) > MaxRecordSize {
		return fields{}, garbled("record is %d bytes, more than %d", len(data), MaxRecordSize)
	}
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return fields{}, garbled("record does not end with a newline (truncated)")
	}
	body := data[:len(data)-1]
	i := bytes.LastIndexByte(body, '\n')
	if i < 0 {
		return fields{}, garbled("record has a single line")
	}
	sealed, last := data[:i+1], body[i+1:]
	sum, ok := bytes.CutPrefix(last, []byte("crc="))
	if !ok || len(sum) != 8 {
		return fields{}, garbled("record does not end with its checksum line (truncated)")
	}
	var want uint32
	for _, c := range sum {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		default:
			return fields{}, garbled("checksum %q is not 8 lowercase hex digits", sum)
		}
		want = want<<4 | uint32(v)
	}
	if got := crc32.ChecksumIEEE(sealed); got != want {
		return fields{}, garbled("checksum mismatch: record says %08x, content is %08x", want, got)
	}

	rest := sealed
	line := func() []byte {
		j := bytes.IndexByte(rest, '\n') // sealed ends with '\n'
		l := rest[:j]
		rest = rest[j+1:]
		return l
	}
	if h := line(); string(h) != magic+" "+version+" "+kind {
		return fields{}, garbled("header %q is not %q", h, magic+" "+version+" "+kind)
	}
	keys := keysOf(kind)
	f := fields{keys: keys}
	for n, k := range keys {
		if len(rest) == 0 {
			return fields{}, garbled("key %q is missing", k)
		}
		// The line is k=value (no key holds '=').
		l := line()
		if len(l) <= len(k) || string(l[:len(k)]) != k || l[len(k)] != '=' {
			return fields{}, garbled("line %q: want key %q", l, k)
		}
		f.values[n] = l[len(k)+1:]
	}
	if len(rest) != 0 {
		return fields{}, garbled("unexpected lines after key %q", keys[len(keys)-1])
	}
	var err error
	if f.attempt.RunID, err = f.textLike("run", like.RunID); err != nil {
		return fields{}, err
	}
	if f.attempt.TaskID, err = f.textLike("task", like.TaskID); err != nil {
		return fields{}, err
	}
	if f.attempt.Try, err = f.int32("try"); err != nil {
		return fields{}, err
	}
	if f.attempt.Epoch, err = f.int32("epoch"); err != nil {
		return fields{}, err
	}
	return f, nil
}

func (f *fields) value(k string) []byte {
	for i, key := range f.keys {
		if key == k {
			return f.values[i]
		}
	}
	return nil
}

func (f *fields) text(k string) (string, error) {
	s, err := Unescape(string(f.value(k)))
	if err != nil {
		return "", garbled("%s: %v", k, err)
	}
	return s, nil
}

// textLike is text, but returns like itself when the value is exactly
// Escape(like): Escape gives each string one encoding and Unescape accepts
// only that one, so the value decodes to like, and no copy is made.
func (f *fields) textLike(k, like string) (string, error) {
	if isEscapeOf(f.value(k), like) {
		return like, nil
	}
	return f.text(k)
}

// number decodes the canonical decimal form of a number (no sign but a
// leading '-' on a non-zero value, no leading zeros), so every record has
// exactly one encoding ("007" or "+7" is garbled). ok is false on overflow
// of 63 bits and on anything else.
func number(b []byte) (n int64, ok bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 || (len(b) > 1 && b[0] == '0') || (neg && b[0] == '0') {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

func (f *fields) int32(k string) (int32, error) {
	n, ok := number(f.value(k))
	if !ok || n < math.MinInt32 || n > math.MaxInt32 {
		return 0, garbled("%s=%q is not a 32-bit integer", k, f.value(k))
	}
	return int32(n), nil
}

func (f *fields) uint(k string) (uint64, error) {
	n, ok := number(f.value(k))
	if !ok || n < 0 {
		return 0, garbled("%s=%q is not an unsigned integer", k, f.value(k))
	}
	return uint64(n), nil
}

// pid decodes a process or group id; 1 or less (init, "every process", the
// caller's group) is garbled: such a number must never reach kill(2).
func (f *fields) pid(k string) (int, error) {
	n, ok := number(f.value(k))
	if !ok || n < math.MinInt32 || n > math.MaxInt32 {
		return 0, garbled("%s=%q is not a process id", k, f.value(k))
	}
	if n <= 1 {
		return 0, garbled("%s=%d: a process id of 1 or less is never ours", k, n)
	}
	return int(n), nil
}

// Escape percent-encodes s so that it holds only ASCII letters, digits, '.'
// and '-'. Everything else, '_' and '%' included, becomes %XX (upper-case
// hex), so "__" never appears in an escaped id and can separate ids in a
// file name.
func Escape(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	return string(appendEscape(make([]byte, 0, len(s)+2*n), s))
}

const upperHex = "0123456789ABCDEF"

// appendEscape appends Escape(s) to dst.
func appendEscape(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', upperHex[c>>4], upperHex[c&15])
	}
	return dst
}

// isEscapeOf reports whether b is exactly Escape(s), without building it.
func isEscapeOf(b []byte, s string) bool {
	j := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			if j >= len(b) || b[j] != c {
				return false
			}
			j++
			continue
		}
		if j+3 > len(b) || b[j] != '%' || b[j+1] != upperHex[c>>4] || b[j+2] != upperHex[c&15] {
			return false
		}
		j += 3
	}
	return j == len(b)
}

// Unescape reverses Escape. It accepts only Escape's own output, so one
// string has one encoding.
func Unescape(s string) (string, error) {
	if !strings.ContainsRune(s, '%') {
		for i := 0; i < len(s); i++ {
			if !plain(s[i]) {
				return "", fmt.Errorf("byte %q must be escaped", s[i])
			}
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b = append(b, c)
			continue
		}
		if c != '%' || i+2 >= len(s) {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("bad escape %q", s[i:i+3])
		}
		v := hi<<4 | lo
		if plain(v) {
			return "", fmt.Errorf("escape %q of a plain byte", s[i:i+3])
		}
		b = append(b, v)
		i += 2
	}
	return string(b), nil
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
