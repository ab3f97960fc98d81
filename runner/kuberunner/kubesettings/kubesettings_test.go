package kubesettings_test

import (
	"reflect"
	"testing"

	"github.com/dexaflow/reaper/internal/settingrule"
	"github.com/dexaflow/reaper/runner/kuberunner/kubesettings"
)

// The defaults make valid settings: pods never root, a read-only root.
func TestDefaultBlockMakesValidSettings(t *testing.T) {
	b := kubesettings.DefaultBlock()
	b.Image = "task:1"
	s, problems := b.Settings()
	if len(problems) > 0 {
		t.Fatalf("problems %+v", problems)
	}
	if s.RunAsUser != kubesettings.RunAsDefault || s.RunAsGroup != kubesettings.RunAsDefault || !s.ReadOnlyRoot || s.Image != "task:1" {
		t.Fatalf("settings %+v", s)
	}
}

// Each refusal names its key, in the order of the block's rules.
func TestBlockRefusalsNameTheirKeys(t *testing.T) {
	b := kubesettings.DefaultBlock()
	b.RunAsUser, b.DispatchWorkers, b.PullPolicy, b.CPULimit = 0, 2, "Sometimes", "lots"
	_, problems := b.Settings()
	var keys [][]string
	for _, p := range problems {
		keys = append(keys, p.Keys)
	}
	want := [][]string{{"run_as_user"}, {"dispatch_workers"}, {"image_pull_policy"}, {"cpu_limit"}}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("refused %v, want %v", keys, want)
	}
	wp, problems := kubesettings.WarmPoolBlock{Size: 0.5, Name: "ETL"}.WarmPool(true)
	if want := []settingrule.Problem{
		settingrule.At("size", "size must be a whole number, 1 or more."),
		settingrule.At("name", "name must be 1 to 30 lowercase letters, digits or dashes, starting and ending with a letter or digit."),
	}; !reflect.DeepEqual(problems, want) || wp.Size != 0 {
		t.Fatalf("warm pool %+v, refused %+v", wp, problems)
	}
}
