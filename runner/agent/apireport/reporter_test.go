package apireport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
)

func callErr(code int) error {
	return fmt.Errorf("attempt api /v1/running: %w", &attemptapi.CallError{Status: code})
}

func transportErr(err error) error {
	return fmt.Errorf("attempt api /v1/running: %w", &url.Error{Op: "Post", URL: "https://api", Err: err})
}

// decodeErr is the error of decoding an unreadable answer.
func decodeErr(t *testing.T, data string, into any) error {
	t.Helper()
	err := json.Unmarshal([]byte(data), into)
	if err == nil {
		t.Fatalf("%q decoded", data)
	}
	return fmt.Errorf("attempt api /v1/running: decoding the answer: %w", err)
}

// Each failure of a call is one of three: an answer that never came (it
// wraps agent.ErrUnanswered, which the agent's pre-start rule counts), a
// refusal (it wraps agent.ErrRefused: not retried, never the infra marker),
// or an answer that is neither (retried, and no answer that never came).
// Every classified failure still wraps the call's own error.
func TestAPIReporterFailureClassification(t *testing.T) {
	const (
		unanswered = "unanswered"
		refusal    = "refusal"
		answer     = "answer"
	)
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"ConnectionRefused_Unanswered": {transportErr(syscall.ECONNREFUSED), unanswered},
		"ConnectionReset_Unanswered":   {transportErr(syscall.ECONNRESET), unanswered},
		"EOF_Unanswered":               {transportErr(io.EOF), unanswered},
		"TLSFailure_Unanswered": {transportErr(&tls.CertificateVerificationError{
			Err: x509.UnknownAuthorityError{}}), unanswered},
		"Deadline_Unanswered": {transportErr(context.DeadlineExceeded), unanswered},
		"ClientTimeout_Unanswered": {transportErr(&net.OpError{Op: "read", Net: "tcp",
			Err: os.ErrDeadlineExceeded}), unanswered},
		"AnswerCutShort_Unanswered": {fmt.Errorf("attempt api /v1/running: reading the answer: %w",
			io.ErrUnexpectedEOF), unanswered},
		"UnreadableAnswer_Unanswered":    {decodeErr(t, `{"should_terminate":`, &attemptapi.Response{}), unanswered},
		"MistypedAnswer_Unanswered":      {decodeErr(t, `{"should_terminate":"yes"}`, &attemptapi.Response{}), unanswered},
		"429_Unanswered":                 {callErr(429), unanswered},
		"500_Unanswered":                 {callErr(500), unanswered},
		"501_Unanswered":                 {callErr(501), unanswered},
		"502_Unanswered":                 {callErr(502), unanswered},
		"503_Unanswered":                 {callErr(503), unanswered},
		"504_Unanswered":                 {callErr(504), unanswered},
		"400_Refusal":                    {callErr(400), refusal},
		"401_Refusal":                    {callErr(401), refusal},
		"403_Refusal":                    {callErr(403), refusal},
		"404_Refusal":                    {callErr(404), refusal},
		"409_GuardNoLongerHolds_Refusal": {callErr(409), refusal},
		"302_Answer":                     {callErr(302), answer},
		"AgentCancelled_Answer":          {transportErr(context.Canceled), answer},
	} {
		t.Run(name, func(t *testing.T) {
			err := Classify(c.err)
			got := answer
			switch {
			case agent.ControlPlaneUnanswered(err) && errors.Is(err, agent.ErrRefused):
				t.Fatalf("%v is both unanswered and a refusal", err)
			case agent.ControlPlaneUnanswered(err):
				got = unanswered
			case errors.Is(err, agent.ErrRefused):
				got = refusal
			}
			if got != c.want {
				t.Fatalf("%v is %s, want %s", err, got, c.want)
			}
			if errors.Is(err, agent.ErrUnanswered) != (got == unanswered) {
				t.Fatalf("%v: ControlPlaneUnanswered disagrees with errors.Is(err, agent.ErrUnanswered)", err)
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("%v does not wrap the call's error", err)
			}
		})
	}
	if Classify(nil) != nil {
		t.Fatal("a call that succeeded failed")
	}
}

// The real client against an address nothing listens on.
func TestAPIReporterUnreachableAPIIsUnanswered(t *testing.T) {
	c, err := attemptapi.NewClient("https://"+attemptapitest.FreeAddr(t), "rat1.unverified", "")
	if err != nil {
		t.Fatal(err)
	}
	r := ForClient(c)
	defer r.Close()
	_, err = r.Running(context.Background(), sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}, time.Time{})
	if !errors.Is(err, agent.ErrUnanswered) || errors.Is(err, agent.ErrRefused) {
		t.Fatalf("%v: want an answer that never came", err)
	}
}
