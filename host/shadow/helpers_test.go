package shadow_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
