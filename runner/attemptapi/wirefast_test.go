package attemptapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Every body the hand-read path accepts reads as the strict decoder reads
// it, and every body it passes on is judged by that decoder: the two agree
// on what is accepted and what it says.
func TestTheHandReadBodyIsTheDecoders(t *testing.T) {
	bodies := []string{
		`{"run_id":"r1","task_id":"t1","try":1,"epoch":0}`,
		`{"run_id":"run000042","task_id":"task07","try":2147483647,"epoch":-2147483648}`,
		`{"run_id":"","task_id":"","try":0,"epoch":0}`,
		`{"run_id":"a b<c>&","task_id":"x/y:z","try":-1,"epoch":3}`,
		`{"run_id":"r","task_id":"t","try":2147483648,"epoch":0}`,     // out of int32
		`{"run_id":"r","task_id":"t","try":01,"epoch":0}`,             // not JSON
		`{"run_id":"r","task_id":"t","try":-0,"epoch":0}`,             // the decoder's
		`{"run_id":"r","task_id":"t","try":1.0,"epoch":0}`,            // not an int
		`{"run_id":"r","task_id":"t","try":1,"epoch":0} `,             // whitespace
		`{"run_id":"r","task_id":"t","try":1,"epoch":0}{}`,            // trailing
		`{"run_id":"r\u0031","task_id":"t","try":1,"epoch":0}`,        // an escape
		`{"run_id":"r","task_id":"t","try":1,"epoch":0,"extra":1}`,    // unknown field
		`{"task_id":"t","run_id":"r","try":1,"epoch":0}`,              // another order
		`{"run_id":"r","task_id":"t","try":1,"epoch":0,"worker":"w"}`, // another call's
		"{\"run_id\":\"r\xff\",\"task_id\":\"t\",\"try\":1,\"epoch\":0}",
		"{\"run_id\":\"r\x01\",\"task_id\":\"t\",\"try\":1,\"epoch\":0}",
		`{"run_id":"r","task_id":"t","try":1,"epoch":0`,
		``,
	}
	var wb wireBuffers
	for _, body := range bodies {
		var fast Request
		handRead := parseAttemptBody([]byte(body), &fast)
		var got Request
		_, gotErr := wb.readRequest(strings.NewReader(body), &got)
		var want Request
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		wantErr := dec.Decode(&want)
		if wantErr == nil {
			if _, err := dec.Token(); err == nil || err.Error() != "EOF" {
				wantErr = errTrailing{}
			}
		}
		if (gotErr == nil) != (wantErr == nil) || (wantErr == nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("%q: read %+v, %v; the decoder %+v, %v", body, got, gotErr, want, wantErr)
		}
		if handRead && (wantErr != nil || !reflect.DeepEqual(fast, want)) {
			t.Errorf("%q: read by hand as %+v, the decoder says %+v, %v", body, fast, want, wantErr)
		}
	}
	// What Client writes is read by hand.
	raw, err := json.Marshal(Request{RunID: "run000001", TaskID: "task01", Try: 3, Epoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !parseAttemptBody(raw, new(Request)) {
		t.Errorf("%s: the client's own body is not read by hand", raw)
	}
	// Past maxBody: too large.
	if tooLarge, _ := wb.readRequest(bytes.NewReader(make([]byte, maxBody+1)), new(Request)); !tooLarge {
		t.Error("a body past maxBody is not too large")
	}
}

// Every answer written by hand is byte for byte the encoder's.
func TestTheHandWrittenAnswerIsTheEncoders(t *testing.T) {
	at := time.Date(2030, 1, 2, 12, 0, 0, 123456789, time.UTC)
	answers := []struct {
		resp Response
		hand bool
	}{
		{Response{}, true},
		{Response{ShouldTerminate: true}, true},
		{Response{Capped: true}, true},
		{Response{Token: "reaper-attempt.k1.AAEC-_x.sig_-", ExpiresAt: at}, true},
		{Response{Token: "t", ExpiresAt: at.In(time.FixedZone("x", 3600))}, true},
		{Response{Token: "t<&>"}, false},
		{Response{State: "running"}, false},
		{Response{Attempts: []Claimed{{RunID: "r"}}}, false},
		{Response{ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
	}
	var wb wireBuffers
	for _, a := range answers {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(a.resp)
		hand, ok := appendResponse(nil, a.resp)
		if ok != a.hand {
			t.Errorf("%+v: written by hand %v, want %v", a.resp, ok, a.hand)
		}
		if ok && string(hand) != want.String() {
			t.Errorf("%+v: by hand %q, the encoder %q", a.resp, hand, want.String())
		}
		var got bytes.Buffer
		wb.writeResponse(&got, a.resp)
		if got.String() != want.String() {
			t.Errorf("%+v: written %q, the encoder %q", a.resp, got.String(), want.String())
		}
	}
}

// BenchmarkHeartbeatWire is a heartbeat's body read and answer written,
// with the decoder and encoder as before and by hand.
func BenchmarkHeartbeatWire(b *testing.B) {
	body, err := json.Marshal(Request{RunID: "run000042", TaskID: "task07", Try: 1})
	if err != nil {
		b.Fatal(err)
	}
	var out bytes.Buffer
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req Request
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				b.Fatal(err)
			}
			if _, err := dec.Token(); err == nil {
				b.Fatal("trailing")
			}
			out.Reset()
			_ = json.NewEncoder(&out).Encode(Response{})
		}
	})
	b.Run("by hand", func(b *testing.B) {
		b.ReportAllocs()
		var wb wireBuffers
		for b.Loop() {
			var req Request
			if _, err := wb.readRequest(bytes.NewReader(body), &req); err != nil {
				b.Fatal(err)
			}
			out.Reset()
			wb.writeResponse(&out, Response{})
		}
	})
}
