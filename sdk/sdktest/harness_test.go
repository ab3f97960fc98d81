package sdktest

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/ladder"
)

// echo is a reaper that appends its name to the state it receives and
// remembers the last pass it was given.
type echo struct {
	name string
	last sdk.Pass
}

func (e *echo) Info(context.Context) (sdk.Info, error) { return sdk.Info{Name: e.name}, nil }
func (e *echo) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.Schema{Attributes: []sdk.Attribute{{Name: "k", Type: sdk.TypeString, Default: "d"}}}, nil
}
func (e *echo) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	if req.Values.String("k") != "d" || req.Edition != ladder.EditionKube {
		panic("defaults not applied")
	}
	return nil
}
func (e *echo) Reap(ctx context.Context, pass sdk.Pass, _ sdk.Board, _ sdk.Executions, sink sdk.Sink) (sdk.PassResult, error) {
	e.last = pass
	err := sink.Record(ctx, []sdk.Decision{{Label: sdk.LabelOrphanRun, Attempt: sdk.Attempt{RunID: e.name}, Applied: true}})
	return sdk.PassResult{State: append(pass.State, e.name...)}, err
}

func TestHarness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := New(ladder.EditionKube)
	a, b := &echo{name: "a"}, &echo{name: "b"}
	if err := h.Configure(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	h.DryRun = true
	for range 2 {
		if _, err := h.Reap(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	ds, _ := h.Reap(ctx, b)
	if got := string(h.StateOf("a")); got != "aa" {
		t.Fatalf("state of a %q", got)
	}
	if got := string(h.StateOf("b")); got != "b" {
		t.Fatalf("state of b %q", got)
	}
	p := b.last
	if !p.Now.Equal(T0()) || !p.Deadline.Equal(T0().Add(30*time.Second)) || p.Term != 1 || !p.DryRun || p.Edition != ladder.EditionKube {
		t.Fatalf("pass %+v", p)
	}
	if ds.Label(sdk.Attempt{RunID: "b"}) != sdk.LabelOrphanRun || ds.Count(sdk.LabelOrphanRun) != 1 || len(ds.Applied()) != 1 {
		t.Fatalf("decisions %+v", ds)
	}
	if h.Board.Row(sdk.Attempt{RunID: "x", TaskID: "y"}).State != "" {
		t.Fatal("a missing row is the zero row")
	}
}
