package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dexaflow/reaper/sdk"
)

func TestTaskIDLabel(t *testing.T) {
	for in, want := range map[string]string{"load_a": "load-a", "load-a": "load-a", "Load.A": "load-a", "x": "x",
		"task07": "task07", "ÉTAPE_1": "étape-1", "a-b.c_d": "a-b-c-d", "": ""} {
		if got := TaskIDLabel(in); got != want {
			t.Errorf("TaskIDLabel(%q) = %q, want %q", in, got, want)
		}
	}
	// A task id that is its own label (the common case, spelt on every
	// cache lookup) costs nothing to spell.
	if n := testing.AllocsPerRun(100, func() { _ = TaskIDLabel("extract-orders-42") }); n != 0 {
		t.Errorf("TaskIDLabel of a plain id allocates %v times", n)
	}
}

func TestMatching(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "load_a", Try: 2, Epoch: 1}
	sibling := sdk.Attempt{RunID: "r", TaskID: "load-a", Try: 2, Epoch: 1}
	tests := []struct {
		name string
		pod  *pod
		a    sdk.Attempt
		want bool
	}{
		{"SameAttempt_Matches", podOf(a, corev1.PodRunning), a, true},
		{"CollidingTaskLabel_AnnotationTellsApart", podOf(sibling, corev1.PodRunning), a, false},
		{"WithoutAnnotation_MatchedOnLabelsAlone", podOf(sibling, corev1.PodRunning, withoutAnnotation()), a, true},
		{"AnotherTry_NoMatch", podOf(sdk.Attempt{RunID: "r", TaskID: "load_a", Try: 3, Epoch: 1}, corev1.PodRunning), a, false},
		{"AnotherEpoch_NoMatch", podOf(sdk.Attempt{RunID: "r", TaskID: "load_a", Try: 2, Epoch: 2}, corev1.PodRunning), a, false},
		{"AnotherRun_NoMatch", podOf(sdk.Attempt{RunID: "r2", TaskID: "load_a", Try: 2, Epoch: 1}, corev1.PodRunning), a, false},
		{"NoEpochLabel_CountsAsZero", podOf(sdk.Attempt{RunID: "r", TaskID: "load_a", Try: 2}, corev1.PodRunning, withoutEpoch()),
			sdk.Attempt{RunID: "r", TaskID: "load_a", Try: 2}, true},
		{"NoEpochLabel_NotEpochOne", podOf(a, corev1.PodRunning, withoutEpoch()), a, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.pod.labels.matches(tt.a); got != tt.want {
				t.Fatalf("matches = %v, want %v", got, tt.want)
			}
			if tt.want && tt.pod.labels.indexKey() != attemptIndexKey(tt.a) {
				t.Fatalf("index key %q, attempt's %q", tt.pod.labels.indexKey(), attemptIndexKey(tt.a))
			}
		})
	}
}

func TestPodAttempt(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "Load_A", Try: 4, Epoch: 3}
	if got, ok := podOf(a, corev1.PodRunning).labels.attempt(); !ok || got != a {
		t.Fatalf("attempt = %v, %v; want %v", got, ok, a)
	}
	if got, ok := podOf(a, corev1.PodRunning, withoutAnnotation(), withoutEpoch()).labels.attempt(); !ok ||
		got != (sdk.Attempt{RunID: "r", TaskID: "load-a", Try: 4}) {
		t.Fatalf("attempt without annotation and epoch = %v, %v", got, ok)
	}
	bad := podOf(a, corev1.PodRunning, func(p *corev1.Pod) { p.Annotations[AnnotationRawTaskID] = "other" })
	if _, ok := bad.labels.attempt(); ok {
		t.Fatal("a pod whose annotation contradicts its label names an attempt")
	}
}

func TestSelectorChunks(t *testing.T) {
	var as []sdk.Attempt
	for i := range 100 {
		as = append(as, sdk.Attempt{RunID: "run-0123456789abcdef0123456789abcdef", TaskID: "task_" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Try: 1})
	}
	if n := len(selectorChunks(as)); n != 1 {
		t.Fatalf("a page of 100 attempts of one run: %d chunks, want 1", n)
	}
	for i := range as {
		as[i].RunID = "run-" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "-0123456789abcdef0123456789abcdef0123456789abcdef"
	}
	chunks := selectorChunks(as)
	if len(chunks) > 2 {
		t.Fatalf("a page of 100 attempts of 100 long run ids: %d chunks, want at most 2", len(chunks))
	}
	n := 0
	for _, c := range chunks {
		n += len(c)
	}
	if n != len(as) {
		t.Fatalf("chunks hold %d attempts, want %d", n, len(as))
	}
}

func TestParseRecord(t *testing.T) {
	good, err := Record{Outcome: RecordSuccess, RunID: "r", TaskID: "t", Try: 1, ExitCode: code(0)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := ParseRecord(good + "\n"); !ok || r.Outcome != RecordSuccess || *r.ExitCode != 0 {
		t.Fatalf("ParseRecord(%q) = %+v, %v", good, r, ok)
	}
	for _, bad := range []string{"", "done", `{"outcome":"SUCCESS"}`, `{"dexaflow_outcome":2,"outcome":"SUCCESS","run_id":"r","task_id":"t"}`,
		`{"dexaflow_outcome":1,"outcome":"MAYBE","run_id":"r","task_id":"t"}`, `{"dexaflow_outcome":1,"outcome":"SUCCESS","task_id":"t"}`} {
		if _, ok := ParseRecord(bad); ok {
			t.Errorf("ParseRecord(%q) reads a record", bad)
		}
	}
}

func TestPodAttemptReadsWhatAttemptLabelsWrite(t *testing.T) {
	a := sdk.Attempt{RunID: "r", TaskID: "Load_a.x", Try: 3, Epoch: 2}
	l, ann := AttemptLabels(a)
	if got, ok := PodAttempt(l, ann); !ok || got != a {
		t.Fatalf("PodAttempt = %v, %v; want %v", got, ok, a)
	}
	ann[AnnotationRawTaskID] = "other"
	if got, ok := PodAttempt(l, ann); ok {
		t.Fatalf("an annotation contradicting the label named %v", got)
	}
	delete(l, LabelTryNumber)
	if got, ok := PodAttempt(l, nil); ok {
		t.Fatalf("a pod without its try label named %v", got)
	}
}
