package plugin

import (
	"context"
	"reflect"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/dexaflow/reaper/sdk"
)

// infoReaper is a reaper that only describes itself.
type infoReaper struct{ info sdk.Info }

func (r infoReaper) Info(context.Context) (sdk.Info, error)              { return r.info, nil }
func (infoReaper) ConfigSchema(context.Context) (sdk.Schema, error)      { return sdk.Schema{}, nil }
func (infoReaper) Configure(context.Context, sdk.ConfigureRequest) error { return nil }
func (infoReaper) Reap(context.Context, sdk.Pass, sdk.Board, sdk.Executions, sdk.Sink) (sdk.PassResult, error) {
	return sdk.PassResult{}, nil
}

// Every field of a plugin's Info reaches the host, the failure reasons
// its marks carry included (the host files the marks it recovers by them),
// and the labels its decisions may carry (the host refuses any other).
func TestInfoOverGoPlugin(t *testing.T) {
	t.Parallel()
	want := sdk.Info{Name: "parked", Kind: sdk.KindReaper, Version: "0.1.0", Editions: []string{"lite", "kube"},
		Description: "fails parked attempts", MarkReasons: []string{"parked_expired", "parked_lost"},
		DecisionLabels: []string{"parked_process_alive"}, KillLabels: []string{"parked_expired", "parked_lost"},
		ProvisionalLabels: []string{"parked_lost"}}
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{PluginReaper: &ReaperPlugin{Impl: infoReaper{want}}})
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(PluginReaper)
	if err != nil {
		t.Fatal(err)
	}
	got, err := raw.(sdk.Reaper).Info(t.Context())
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("info %+v (err %v), want %+v", got, err, want)
	}
}
