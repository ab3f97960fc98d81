package launch_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/host/config"
	"github.com/dexaflow/reaper/host/launch"
	"github.com/dexaflow/reaper/host/loader"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/testbin"
)

// pluginDir holds reaper-agentlost, built once for this package: a reaper
// whose Info, schema and Configure come from reap.Base.
var pluginDir string

func TestMain(m *testing.M) {
	os.Exit(testbin.Main(m, "plugins", []string{"github.com/dexaflow/reaper/plugins/agentlost/cmd/reaper-agentlost"},
		func(m *testing.M, bin string) int {
			pluginDir = bin
			return m.Run()
		}))
}

// A reaper built on reap.Base is configured from its block as the host
// configures every plugin: what it refuses is a diagnostic at the file and
// line of the attribute it names, and its Info (the failure reasons its
// marks carry included) crosses the protocol whole.
func TestStartOne_ReaperOnTheBase(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		block string // the lines of the reaper block, from line 4
		want  string // the diagnostic; "" when the block is accepted
	}{
		"GoodBlock_Configured": {block: "  policy = \"hold\"\n  brake_share = 0.25\n"},
		"EmbeddedSettingRefused_AtItsLine": {block: "  dry_run = true\n  policy = \"reset\"\n",
			want: `reaper.hcl:6:12: reaper plugin "agentlost" refused its configuration: attribute "policy": must be "replace" or "hold", got "reset"`},
		"BrakeRefused_AtItsLine": {block: "  brake_share = 2\n",
			want: `reaper.hcl:5:17: reaper plugin "agentlost" refused its configuration: attribute "brake_share": must be greater than 0 and at most 1, got 2`},
		"FractionalPages_AtItsLine": {block: "  drain_max_pages = 1.5\n",
			want: `reaper.hcl:5:21: reaper plugin "agentlost" refused its configuration: attribute "drain_max_pages"`},
		"UnknownAttribute_AtItsLine": {block: "  polcy = \"hold\"\n",
			want: `reaper.hcl:5:3: Unsupported argument: An argument named "polcy" is not expected here.`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := fmt.Sprintf("edition = \"lite\"\nplugin_dir = %q\nsubstrate \"lite\" {}\nreaper \"agentlost\" {\n%s}\n", pluginDir, tc.block)
			cfg, err := config.Parse("reaper.hcl", []byte(src), config.Options{})
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ld := &loader.Loader{Dir: pluginDir, Logger: hclog.NewNullLogger()}
			h, err := launch.StartOne(ctx, ld, cfg, cfg.Reapers[0])
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want it to contain %s", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			defer h.Kill()
			want := []string{sdk.LabelAgentLost, sdk.LabelCredentialCeiling}
			if h.Info.Name != "agentlost" || h.Info.Kind != sdk.KindReaper || !reflect.DeepEqual(h.Info.MarkReasons, want) {
				t.Fatalf("info %+v, want agentlost's, declaring %v", h.Info, want)
			}
		})
	}
}
