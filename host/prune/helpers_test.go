package prune_test

import (
	"context"
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// idle is a substrate whose sweep finds nothing.
type idle struct{ sdk.Substrate }

func (idle) Sweep(context.Context, sdk.SweepRequest, sdk.Board) (sdk.SweepResult, error) {
	return sdk.SweepResult{}, nil
}

func (idle) Synced(context.Context) (bool, error) { return true, nil }
