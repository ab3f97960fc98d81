package reap

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// Base is the part of a reaper plugin that every reaper writes the same
// way: who it is (Info), the configuration it accepts (ConfigSchema,
// derived from its tagged configuration struct C by sdk.SchemaOf), and the
// configuration the host decoded for it (Configure, read back into C by
// sdk.Values.Decode, C's Validate methods included), held atomically so
// that a Configure never races a pass reading it. It also holds the
// plugin's logger and the stopwatch its passes are measured on.
//
// A reaper embeds it and adds Reap:
//
//	type Reaper struct{ *reap.Base[Config] }
//
//	func New(logger hclog.Logger) *Reaper {
//		return &Reaper{reap.NewBase(logger, DefaultConfig, sdk.Info{Name: Name, ...})}
//	}
//
// and reads r.Config() once at the start of each pass.
type Base[C any] struct {
	info      sdk.Info
	defaults  func() C
	logger    hclog.Logger
	stopwatch clock.Clock

	cfg atomic.Pointer[C] // set by Configure, read once a pass
}

// NewBase returns the base of a reaper that describes itself as info and
// whose configuration block is C, holding the configuration defaults
// returns (a block that sets nothing) until the host configures it. A nil
// defaults means C's zero value; a nil logger discards. An info that leaves
// Kind or Version empty says sdk.KindReaper and sdk.BuildVersion.
func NewBase[C any](logger hclog.Logger, defaults func() C, info sdk.Info) *Base[C] {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if defaults == nil {
		defaults = func() C { var c C; return c }
	}
	if info.Kind == "" {
		info.Kind = sdk.KindReaper
	}
	if info.Version == "" {
		info.Version = sdk.BuildVersion
	}
	info.Editions, info.MarkReasons = slices.Clone(info.Editions), slices.Clone(info.MarkReasons)
	info.DecisionLabels = slices.Clone(info.DecisionLabels)
	info.KillLabels, info.ProvisionalLabels = slices.Clone(info.KillLabels), slices.Clone(info.ProvisionalLabels)
	b := &Base[C]{info: info, defaults: defaults, logger: logger, stopwatch: clock.Real{}}
	cfg := defaults()
	b.cfg.Store(&cfg)
	return b
}

// Info describes the plugin.
func (b *Base[C]) Info(context.Context) (sdk.Info, error) {
	info := b.info
	info.Editions, info.MarkReasons = slices.Clone(info.Editions), slices.Clone(info.MarkReasons)
	info.DecisionLabels = slices.Clone(info.DecisionLabels)
	info.KillLabels, info.ProvisionalLabels = slices.Clone(info.KillLabels), slices.Clone(info.ProvisionalLabels)
	return info, nil
}

// ConfigSchema declares the tagged fields of C, with the defaults' values.
func (b *Base[C]) ConfigSchema(context.Context) (sdk.Schema, error) {
	return sdk.SchemaOf(b.defaults()), nil
}

// Configure decodes the block the host decoded into C, starting from the
// defaults, validates it, and applies it. An error names the offending
// attribute in quotes, and the host reports it at the attribute's line; a
// refused block leaves the configuration in force as it was.
func (b *Base[C]) Configure(_ context.Context, req sdk.ConfigureRequest) error {
	cfg := b.defaults()
	if err := req.Values.Decode(&cfg); err != nil {
		return err
	}
	b.cfg.Store(&cfg)
	return nil
}

// Config is the configuration in force: a pass reads it once, at its start.
func (b *Base[C]) Config() C { return *b.cfg.Load() }

// Logger is the plugin's logger.
func (b *Base[C]) Logger() hclog.Logger { return b.logger }

// Stopwatch is the clock a pass is measured on against its budget
// (reap.Spec.Stopwatch); the real clock unless SetStopwatch changed it.
func (b *Base[C]) Stopwatch() clock.Clock { return b.stopwatch }

// SetStopwatch makes the reaper measure its passes on c instead of the real
// clock, so a test decides how long pages take. Call it before the first
// pass; decisions never read it (they read pass.Now).
func (b *Base[C]) SetStopwatch(c clock.Clock) { b.stopwatch = c }
