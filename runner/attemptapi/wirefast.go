package attemptapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
)

// The heartbeat's fixed shapes, read and written by hand: an agent's
// request body as Client writes it, and an answer of the few fields a
// heartbeat's has. Each is a fast path beside encoding/json, never instead
// of it: a body of any other shape (whitespace, escapes, other fields,
// another order, bytes outside printable ASCII) is read by the strict
// decoder as before, and an answer with any other field set, or with a
// byte the encoder would escape, is written by the encoder. What the fast
// paths accept and write is exactly what encoding/json accepts and writes
// for it (wirefast_test.go holds them to that).

// wireBuffers are a server's buffers for reading bodies and writing
// answers, reused from call to call.
type wireBuffers struct {
	bodies  sync.Pool // *bytes.Buffer
	answers sync.Pool // *[]byte
	// frames are the heartbeat stream's frame buffers (maxStreamFrame),
	// held only while a frame is served: a stream waiting for its next
	// frame holds none.
	frames sync.Pool // *[]byte
}

// frame is a buffer of maxStreamFrame bytes; put it back in frames.
func (wb *wireBuffers) frame() *[]byte {
	if bp, _ := wb.frames.Get().(*[]byte); bp != nil {
		return bp
	}
	b := make([]byte, maxStreamFrame)
	return &b
}

// keptBuffer is the largest buffer kept for reuse (a report's long
// message is not).
const keptBuffer = 4 << 10

// readRequest reads body (at most maxBody bytes; tooLarge past it) into
// req: by hand when it is the shape Client writes, else with the strict
// decoder (unknown fields refused; errTrailing after the value).
func (wb *wireBuffers) readRequest(body io.Reader, req *Request) (tooLarge bool, err error) {
	buf, _ := wb.bodies.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	defer func() {
		if buf.Cap() <= keptBuffer {
			buf.Reset()
			wb.bodies.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(body, maxBody+1)); err != nil {
		return false, err
	}
	if buf.Len() > maxBody {
		return true, nil
	}
	if parseAttemptBody(buf.Bytes(), req) {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return false, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return false, errTrailing{}
	}
	return false, nil
}

// errTrailing: the body holds more than one JSON value.
type errTrailing struct{}

func (errTrailing) Error() string { return "trailing data after the body" }

// writeResponse writes resp as the answer: by hand when it has only a
// heartbeat's fields, else with the encoder.
func (wb *wireBuffers) writeResponse(w io.Writer, resp Response) {
	bp, _ := wb.answers.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b, ok := appendResponse((*bp)[:0], resp)
	if !ok {
		_ = json.NewEncoder(w).Encode(resp)
		return
	}
	_, _ = w.Write(b)
	if cap(b) <= keptBuffer {
		*bp = b
		wb.answers.Put(bp)
	}
}

// parseAttemptBody reads b when it is exactly
// {"run_id":"…","task_id":"…","try":N,"epoch":N}, as json.Marshal writes
// a Request that names an attempt and nothing else, its strings of
// printable ASCII without escapes and its numbers plain int32s. false:
// not that shape (req untouched).
func parseAttemptBody(b []byte, req *Request) bool {
	var r Request
	var ok bool
	if b, ok = bytes.CutPrefix(b, []byte(`{"run_id":"`)); !ok {
		return false
	}
	if r.RunID, b, ok = plainString(b); !ok {
		return false
	}
	if b, ok = bytes.CutPrefix(b, []byte(`,"task_id":"`)); !ok {
		return false
	}
	if r.TaskID, b, ok = plainString(b); !ok {
		return false
	}
	if b, ok = bytes.CutPrefix(b, []byte(`,"try":`)); !ok {
		return false
	}
	if r.Try, b, ok = plainInt32(b); !ok {
		return false
	}
	if b, ok = bytes.CutPrefix(b, []byte(`,"epoch":`)); !ok {
		return false
	}
	if r.Epoch, b, ok = plainInt32(b); !ok {
		return false
	}
	if string(b) != "}" {
		return false
	}
	*req = r
	return true
}

// plainString reads a string's bytes up to its closing quote, each
// printable ASCII and no backslash, and what follows the quote.
func plainString(b []byte) (string, []byte, bool) {
	for i, c := range b {
		switch {
		case c == '"':
			return string(b[:i]), b[i+1:], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", nil, false
		}
	}
	return "", nil, false
}

// plainInt32 reads 0 or -?[1-9][0-9]* within int32, and what follows it.
func plainInt32(b []byte) (int32, []byte, bool) {
	n := 0
	if n < len(b) && b[n] == '-' {
		n++
	}
	start := n
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	digits := b[start:n]
	if len(digits) == 0 || len(digits) > 10 || (digits[0] == '0' && (len(digits) > 1 || start > 0)) {
		return 0, nil, false
	}
	v, err := strconv.ParseInt(string(b[:n]), 10, 32)
	if err != nil {
		return 0, nil, false
	}
	return int32(v), b[n:], true
}

// appendResponse appends resp as json.NewEncoder(w).Encode writes it
// (newline included) when it has only a heartbeat's fields (should_terminate,
// token, expires_at, capped) and a token of base64url and dots; false:
// resp is for the encoder.
func appendResponse(out []byte, resp Response) ([]byte, bool) {
	if resp.State != "" || resp.Attempts != nil || !plainToken(resp.Token) {
		return out, false
	}
	out = append(out, `{"should_terminate":`...)
	out = strconv.AppendBool(out, resp.ShouldTerminate)
	if resp.Token != "" {
		out = append(out, `,"token":"`...)
		out = append(out, resp.Token...)
		out = append(out, '"')
	}
	if !resp.ExpiresAt.IsZero() {
		t, err := resp.ExpiresAt.MarshalJSON()
		if err != nil {
			return out, false
		}
		out = append(out, `,"expires_at":`...)
		out = append(out, t...)
	}
	if resp.Capped {
		out = append(out, `,"capped":true`...)
	}
	return append(out, "}\n"...), true
}

// plainToken: every byte of tok is one the encoder writes as it is.
func plainToken(tok string) bool {
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
