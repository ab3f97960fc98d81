package boardtest_test

import (
	"testing"

	"github.com/dexaflow/reaper/sdk/sdktest/boardtest"
)

// The in-memory board (sdktest.Board) passes the board's conformance suite;
// the Postgres board runs the same suite in package board.
func TestConformance(t *testing.T) { boardtest.Run(t, boardtest.Memory) }
