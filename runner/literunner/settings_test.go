package literunner_test

import (
	"reflect"
	"testing"

	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/internal/settingrule"
	"github.com/dexaflow/reaper/runner/literunner"
)

// The runner block's rules refuse, each at its key, caps that are not
// whole numbers of 0 or more and a recovery budget out of bounds; a pool
// block's, slots out of bounds (and then nothing more) and its own budget.
func TestSettingsRules(t *testing.T) {
	b := literunner.DefaultBlock()
	if s, problems := b.Settings(); len(problems) > 0 ||
		s.Recovery.Default != (lifecycle.RecoveryLimit{Rate: lifecycle.RecoveryRateDefault, Burst: lifecycle.RecoveryBurstDefault}) {
		t.Fatalf("defaults: %+v, refused %+v", s, problems)
	}
	b.MaxParallel, b.MaxActiveRuns, b.RecoveryRate, b.RecoveryBurst = -1, 1.5, -2, 0.5
	_, problems := b.Settings()
	var keys []string
	for _, p := range problems {
		keys = append(keys, p.Keys...)
	}
	if want := []string{"max_parallel", "max_active_runs", "recovery_rate", "recovery_burst"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("refused %v, want %v", keys, want)
	}
	pb := literunner.DefaultPoolBlock(lifecycle.RecoveryLimit{Rate: 3, Burst: 4})
	pb.Slots = 2
	if slots, l, ok, problems := pb.Pool("db"); !ok || slots != 2 || l != (lifecycle.RecoveryLimit{Rate: 3, Burst: 4}) || len(problems) > 0 {
		t.Fatalf("pool: %d %+v %v %+v", slots, l, ok, problems)
	}
	pb.Slots, pb.RecoveryRate = 0, -1
	if _, _, ok, problems := pb.Pool("db"); ok || !reflect.DeepEqual(problems, []settingrule.Problem{
		settingrule.At("slots", `slots of pool "db" must be a whole number from 1 to 1073741824.`)}) {
		t.Fatalf("pool without slots: ok %v, refused %+v", ok, problems)
	}
}
