package reap_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/sdk/ladder"
	"github.com/dexaflow/reaper/sdk/reap"
	"github.com/dexaflow/reaper/sdk/sdktest"
)

// testConfig is a reaper's configuration as a plugin writes one: its own
// attribute, the shared settings embedded, its own check.
type testConfig struct {
	TTL time.Duration `reaper:"ttl" help:"how long"`
	reap.PolicySetting
	reap.DrainSetting
}

func defaultTestConfig() testConfig {
	return testConfig{TTL: time.Hour, PolicySetting: reap.DefaultPolicy()}
}

func (c testConfig) Validate() error {
	if c.TTL <= 0 {
		return fmt.Errorf("attribute %q: must be positive, got %s", "ttl", c.TTL)
	}
	return nil
}

// testReaper embeds the base the way the reapers of this module do.
type testReaper struct{ *reap.Base[testConfig] }

var testInfo = sdk.Info{Name: "tester", Editions: []string{ladder.EditionLite}, Description: "tests the base",
	MarkReasons: []string{"tester_expired"}}

func newTestReaper() *testReaper {
	return &testReaper{reap.NewBase(nil, defaultTestConfig, testInfo)}
}

func (*testReaper) Reap(context.Context, sdk.Pass, sdk.Board, sdk.Executions, sdk.Sink) (sdk.PassResult, error) {
	return sdk.PassResult{}, nil
}

var _ sdk.Reaper = (*testReaper)(nil)

// Configure takes what the host decoded from the block (defaults filled in
// from the schema, as the host does) and either applies all of it or
// refuses it with an error naming the attribute in quotes: what the host
// turns into a diagnostic at that attribute's file and line.
func TestBaseConfigure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	configured := testConfig{TTL: 2 * time.Hour, PolicySetting: reap.PolicySetting{Policy: reap.PolicyHold},
		DrainSetting: reap.DrainSetting{MaxPages: 3}}
	for name, tc := range map[string]struct {
		values sdk.Values
		want   testConfig // when the block is accepted
		bad    string     // what the refusal says, when it is refused
	}{
		"EmptyBlock_Defaults": {want: defaultTestConfig()},
		"EverySetting_Applied": {values: sdk.Values{"ttl": "2h", "policy": "hold", "drain_max_pages": float64(3)},
			want: configured},
		"OwnCheck_Refused":           {values: sdk.Values{"ttl": "0s"}, bad: `attribute "ttl": must be positive, got 0s`},
		"MalformedDuration_Refused":  {values: sdk.Values{"ttl": "soon"}, bad: `attribute "ttl"`},
		"WrongType_Refused":          {values: sdk.Values{"drain_max_pages": "many"}, bad: `attribute "drain_max_pages"`},
		"EmbeddedSettingsCheck":      {values: sdk.Values{"policy": "reset"}, bad: `attribute "policy": must be "replace" or "hold", got "reset"`},
		"NegativePages_Refused":      {values: sdk.Values{"drain_max_pages": float64(-1)}, bad: `attribute "drain_max_pages": must not be negative`},
		"UnknownAttribute_Refused":   {values: sdk.Values{"tll": "1h"}, bad: `attribute "tll": not a setting of this plugin`},
		"FractionalPageCount_Refuse": {values: sdk.Values{"drain_max_pages": 1.5}, bad: `attribute "drain_max_pages"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newTestReaper()
			// A block configured before stays in force when the next one is
			// refused.
			if err := r.Configure(ctx, sdk.ConfigureRequest{Values: sdk.Values{"ttl": "3h"}}); err != nil {
				t.Fatalf("first configure: %v", err)
			}
			before := r.Config()
			err := sdktest.New(ladder.EditionLite).Configure(ctx, r, tc.values)
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.bad == "" && r.Config() != tc.want:
				t.Fatalf("config %+v, want %+v", r.Config(), tc.want)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("err %v, want one saying %s", err, tc.bad)
			case tc.bad != "" && r.Config() != before:
				t.Fatalf("a refused block changed the config: %+v, was %+v", r.Config(), before)
			}
		})
	}
}

// The schema is the tagged struct's, the defaults its default values.
func TestBaseConfigSchema(t *testing.T) {
	t.Parallel()
	s, err := newTestReaper().ConfigSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, a := range s.Attributes {
		got[a.Name] = a.Default
	}
	want := map[string]any{"ttl": "1h0m0s", "policy": "replace", "drain_max_pages": float64(0)}
	if len(got) != len(want) {
		t.Fatalf("attributes %+v, want %v", s.Attributes, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("attribute %q default %v, want %v (schema %+v)", k, got[k], v, s.Attributes)
		}
	}
}

func TestBaseInfo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		info sdk.Info
		want sdk.Info
	}{
		"KindAndVersion_Filled": {info: testInfo, want: sdk.Info{Name: "tester", Kind: sdk.KindReaper,
			Version: sdk.BuildVersion, Editions: []string{ladder.EditionLite}, Description: "tests the base",
			MarkReasons: []string{"tester_expired"}}},
		"OwnVersion_Kept": {info: sdk.Info{Name: "parked", Version: "0.1.0", Editions: []string{ladder.EditionLite, ladder.EditionKube}},
			want: sdk.Info{Name: "parked", Kind: sdk.KindReaper, Version: "0.1.0", Editions: []string{ladder.EditionLite, ladder.EditionKube}}},
		"NoMarkReasons": {info: sdk.Info{Name: "watcher", Editions: []string{ladder.EditionKube}},
			want: sdk.Info{Name: "watcher", Kind: sdk.KindReaper, Version: sdk.BuildVersion, Editions: []string{ladder.EditionKube}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := reap.NewBase[testConfig](nil, nil, tc.info)
			got, err := b.Info(ctx)
			if err != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Fatalf("info %+v (err %v), want %+v", got, err, tc.want)
			}
			// What a caller does with the answer is not the plugin's.
			got.Editions[0] = "other"
			if len(got.MarkReasons) > 0 {
				got.MarkReasons[0] = "other"
			}
			if again, _ := b.Info(ctx); fmt.Sprintf("%+v", again) != fmt.Sprintf("%+v", tc.want) {
				t.Fatalf("info changed under the caller: %+v", again)
			}
		})
	}
}

// With no defaults the configuration is C's zero value; a nil logger
// discards; the stopwatch is the real clock until a test sets its own.
func TestBaseZeroDefaultsLoggerAndStopwatch(t *testing.T) {
	t.Parallel()
	b := reap.NewBase[testConfig](nil, nil, testInfo)
	if b.Config() != (testConfig{}) {
		t.Fatalf("config %+v, want the zero value", b.Config())
	}
	if b.Logger() == nil {
		t.Fatal("no logger")
	}
	b.Logger().Info("discarded")
	if _, ok := b.Stopwatch().(clock.Real); !ok {
		t.Fatalf("stopwatch %T, want the real clock", b.Stopwatch())
	}
	fake := clock.NewFake(time.Date(2030, 1, 7, 9, 0, 0, 0, time.UTC))
	b.SetStopwatch(fake)
	if b.Stopwatch() != clock.Clock(fake) {
		t.Fatalf("stopwatch %T, want the one set", b.Stopwatch())
	}
}

// A Configure (the host restarting the plugin, say) never races a pass
// reading the configuration: a reader sees one whole configuration or the
// other, never a mix. Run under -race.
func TestBaseConfigureWhileReading(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newTestReaper()
	blocks := []sdk.Values{{"ttl": "2h", "policy": "hold", "drain_max_pages": float64(3)}, {"ttl": "5m"}}
	whole := map[testConfig]bool{defaultTestConfig(): true}
	for _, v := range blocks {
		c := defaultTestConfig()
		if err := v.Decode(&c); err != nil {
			t.Fatal(err)
		}
		whole[c] = true
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				if err := r.Configure(ctx, sdk.ConfigureRequest{Values: blocks[(i+j)%2]}); err != nil {
					errs <- err
					return
				}
			}
		})
		wg.Go(func() {
			for range 200 {
				if c := r.Config(); !whole[c] {
					errs <- fmt.Errorf("read a configuration no block made: %+v", c)
					return
				}
				if _, err := r.Info(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
