package plugin

import (
	"context"
	"reflect"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// stubSubstrate serves exec as a substrate; the rest answers nothing.
type stubSubstrate struct{ sdk.Executions }

func (stubSubstrate) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: "stub", Kind: sdk.KindSubstrate}, nil
}
func (stubSubstrate) ConfigSchema(context.Context) (sdk.Schema, error)      { return sdk.Schema{}, nil }
func (stubSubstrate) Configure(context.Context, sdk.ConfigureRequest) error { return nil }
func (stubSubstrate) Sweep(context.Context, sdk.SweepRequest, sdk.Board) (sdk.SweepResult, error) {
	return sdk.SweepResult{}, nil
}
func (stubSubstrate) Synced(context.Context) (bool, error) { return true, nil }

// withFeed is a stub substrate with a change feed.
type withFeed struct {
	stubSubstrate
	feed sdk.ChangeFeed
}

func (w withFeed) Changes(ctx context.Context, since sdk.FeedCursor) (sdk.FeedChanges, error) {
	return w.feed.Changes(ctx, since)
}

func dispenseSubstrate(t *testing.T, impl sdk.Substrate) sdk.Substrate {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{"substrate": &SubstratePlugin{Impl: impl}})
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense("substrate")
	if err != nil {
		t.Fatal(err)
	}
	return raw.(sdk.Substrate)
}

func TestChangeFeedOverGoPlugin(t *testing.T) {
	t.Parallel()
	exec, feed := sdktest.NewExecutions(), sdktest.NewFeed()
	exec.UseFeed(feed)
	gone := sdk.Attempt{RunID: "run", TaskID: "t", Try: 2, Epoch: 3}
	feed.Deleted(gone)
	sub := dispenseSubstrate(t, withFeed{stubSubstrate{exec}, feed})
	cf, ok := sub.(sdk.ChangeFeed)
	if !ok {
		t.Fatal("the host's substrate client serves no change feed")
	}
	ch, err := cf.Changes(t.Context(), sdk.FeedCursor{Generation: "g0"})
	if err != nil || !ch.Complete || !reflect.DeepEqual(ch.Gone, []sdk.Attempt{gone}) ||
		ch.Cursor != (sdk.FeedCursor{Generation: "g0", Seq: 1}) {
		t.Fatalf("changes %+v err %v", ch, err)
	}
	feed.Break()
	if ch, err := cf.Changes(t.Context(), ch.Cursor); err != nil || ch.Complete || ch.Detail == "" {
		t.Fatalf("after a break: %+v err %v, want an incomplete answer that says why", ch, err)
	}
}

func TestChangeFeedMissing_UnimplementedOverGoPlugin(t *testing.T) {
	t.Parallel()
	sub := dispenseSubstrate(t, stubSubstrate{sdktest.NewExecutions()}) // a substrate built before the call
	_, err := sub.(sdk.ChangeFeed).Changes(t.Context(), sdk.FeedCursor{})
	if s, ok := status.FromError(unwrapAll(err)); err == nil || !ok || s.Code() != codes.Unimplemented {
		t.Fatalf("a substrate without a feed answered %v, want Unimplemented", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

func TestCandidateQueryOnlyRoundTrips(t *testing.T) {
	t.Parallel()
	q := sdk.CandidateQuery{States: []string{sdk.StateRunning}, Executors: []string{sdk.ExecutorKube},
		OrderBy: sdk.FieldRunningAt, OlderThan: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), Heartbeat: sdk.HeartbeatAny,
		Limit: 100, Only: []sdk.Attempt{{RunID: "r", TaskID: "a", Try: 1, Epoch: 2}, {RunID: "r", TaskID: "b", Try: 3, Epoch: 4}}}
	got := candidateQueryFromPB(candidateQueryToPB(q))
	got.OlderThan = got.OlderThan.UTC()
	if !reflect.DeepEqual(got, q) {
		t.Fatalf("round trip %+v, want %+v", got, q)
	}
	if listingKey(q) == listingKey(sdk.CandidateQuery{States: q.States, Executors: q.Executors, OrderBy: q.OrderBy,
		OlderThan: q.OlderThan, Heartbeat: q.Heartbeat, Limit: q.Limit}) {
		t.Fatal("a narrowed listing shares its read-ahead key with the unnarrowed one")
	}
}
