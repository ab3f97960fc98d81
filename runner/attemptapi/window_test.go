package attemptapi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/attemptapi"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

// window is the heartbeat window of these tests, timed on a fake clock of
// its own.
const window = time.Second

// answer is one heartbeat's answer, taken in a goroutine.
type answer struct {
	resp attemptapi.Response
	err  error
}

// beat sends c's heartbeat for a and answers on the channel.
func beat(c *attemptapi.Client, a sdk.Attempt) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := c.Heartbeat(context.Background(), a)
		ch <- answer{resp, err}
	}()
	return ch
}

// inWindow waits until a batch's leader waits out its window on wclk.
func inWindow(t *testing.T, wclk *clock.Fake) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := wclk.BlockUntil(ctx, 1); err != nil {
		t.Fatal("no heartbeat batch waited out its window")
	}
}

// notYet fails when ch has an answer already.
func notYet(t *testing.T, ch <-chan answer, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s answered before its window's write: %+v %v", what, a.resp, a.err)
	default:
	}
}

func TestHeartbeatWindow(t *testing.T) {
	ctx := context.Background()

	// A rail re-places the attempt while its heartbeat waits in the window:
	// the window's write finds the attempt gone, and the heartbeat is told
	// should_terminate then, without a token though its renewal was due,
	// and writes nothing on the new attempt's row.
	t.Run("ASupersededAttemptIsToldToTerminateByItsWindowsWrite_NeverRenewed", func(t *testing.T) {
		wclk := clock.NewFake(base)
		b := setupWith(t, func(_ *bundle, c *attemptapi.ServerConfig) { c.HeartbeatWindow, c.WindowClock = window, wclk })
		old, oc := b.oneRunning(t)
		b.clk.Advance(ttl / 2) // its renewal is due
		held := oc.Token()
		oldBeat := beat(oc, old)
		inWindow(t, wclk)
		if ok, err := b.w.Fail(ctx, old, []string{sdk.StateRunning}, lifecycle.Failure{Kind: sdk.MarkInfra, Reason: "agent_lost"},
			b.clk.Now()); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if rel, err := b.w.Replace(ctx, old, b.clk.Now()); err != nil || !rel.Applied {
			t.Fatalf("re-place: %+v %v", rel, err)
		}
		notYet(t, oldBeat, "the superseded attempt's heartbeat")
		wclk.Advance(window)
		got := <-oldBeat
		if got.err != nil || !got.resp.ShouldTerminate || got.resp.Token != "" || oc.Token() != held {
			t.Fatalf("the superseded attempt's heartbeat: %+v %v, want should_terminate, no token, the token kept", got.resp, got.err)
		}
		if ti := b.ti(t, old); ti.Epoch != 1 || !ti.LastHeartbeatAt.IsZero() || !ti.CredentialRenewedAt.IsZero() {
			t.Fatalf("the re-placed row took the old attempt's heartbeat: %+v", ti)
		}
		if got := b.meter.Renewals("renewed"); got != 0 {
			t.Fatalf("%d renewals metered for a heartbeat the board refused", got)
		}
	})

	// A heartbeat waits in its window, and is written at the window's end
	// with the time it arrived.
	t.Run("AHeartbeatIsWrittenAtItsWindowsEndWithItsArrival", func(t *testing.T) {
		wclk := clock.NewFake(base)
		b := setupWith(t, func(_ *bundle, c *attemptapi.ServerConfig) { c.HeartbeatWindow, c.WindowClock = window, wclk })
		a, c := b.oneRunning(t)
		b.clk.Advance(15 * time.Second)
		arrival := b.clk.Now()
		ch := beat(c, a)
		inWindow(t, wclk)
		if ti := b.ti(t, a); !ti.LastHeartbeatAt.IsZero() {
			t.Fatalf("heartbeat written at %v before its window ended", ti.LastHeartbeatAt)
		}
		notYet(t, ch, "the heartbeat")
		b.clk.Advance(time.Second) // the board's clock moves on; the arrival is what is written
		wclk.Advance(window)
		if got := <-ch; got.err != nil || got.resp.ShouldTerminate {
			t.Fatalf("heartbeat: %+v %v", got.resp, got.err)
		}
		if ti := b.ti(t, a); !ti.LastHeartbeatAt.Equal(arrival) {
			t.Fatalf("last_heartbeat_at %v, want the arrival %v", ti.LastHeartbeatAt, arrival)
		}
	})

	// The board cannot be written when the window ends: the heartbeat is
	// answered unavailable (503, which the agent retries), not
	// acknowledged; nothing is written or renewed, and the agent keeps its
	// token.
	t.Run("AFailedWriteIsAnsweredUnavailable_NothingAcknowledged", func(t *testing.T) {
		wclk := clock.NewFake(base)
		var apiPool *pgxpool.Pool
		b := setupWith(t, func(b *bundle, c *attemptapi.ServerConfig) {
			p, err := pgxpool.New(ctx, pgtest.DSN(b.pool))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			apiPool = p
			c.Board = lifecycle.New(apiPool, lifecycle.Options{CredentialCeiling: ceiling})
			c.HeartbeatWindow, c.WindowClock = window, wclk
		})
		a, c := b.oneRunning(t)
		b.clk.Advance(ttl / 2) // its renewal is due
		held := c.Token()
		ch := beat(c, a)
		inWindow(t, wclk)
		apiPool.Close() // the API loses its board
		wclk.Advance(window)
		got := <-ch
		var ce *attemptapi.CallError
		if !errors.As(got.err, &ce) || ce.Status != 503 || ce.Body.Code != attemptapi.CodeUnavailable || errors.Is(got.err, attemptapi.ErrRefused) {
			t.Fatalf("heartbeat whose write failed: %+v %v, want 503 %s (retryable)", got.resp, got.err, attemptapi.CodeUnavailable)
		}
		if c.Token() != held {
			t.Fatal("the agent's token changed on a failed heartbeat")
		}
		if ti := b.ti(t, a); !ti.LastHeartbeatAt.IsZero() || !ti.CredentialRenewedAt.IsZero() {
			t.Fatalf("a failed heartbeat wrote: heartbeat %v renewed %v", ti.LastHeartbeatAt, ti.CredentialRenewedAt)
		}
		if got := b.meter.Count("heartbeat/" + attemptapi.CodeUnavailable); got != 1 {
			t.Fatalf("%d heartbeats metered unavailable, want 1", got)
		}
	})
}
