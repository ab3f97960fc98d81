package kube

import (
	"context"
	"hash/fnv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
	"github.com/dexaflow/reaper/testkit/eventually"
)

// An attempt's cached pods are found by a hash of the attempt its labels
// spell, and only the pods whose labels name the attempt exactly are
// answered: attempts whose task ids share a label share the hash, a second
// pod of an attempt shares its entry, another try or epoch is its own. The
// informer keys the slim cached pod by its namespace and name, as it keys
// a whole one. The lookup follows the informer: a pod relabelled to
// another attempt moves, a deleted one goes.
func TestCachedAnswersOnlyTheAttemptsOwnPods(t *testing.T) {
	a := sdk.Attempt{RunID: "run-a", TaskID: "load_a", Try: 1, Epoch: 2}
	sameLabel := sdk.Attempt{RunID: "run-a", TaskID: "load.a", Try: 1, Epoch: 2} // TaskIDLabel: both load-a
	otherEpoch := sdk.Attempt{RunID: "run-a", TaskID: "load_a", Try: 1, Epoch: 1}
	otherTry := sdk.Attempt{RunID: "run-a", TaskID: "load_a", Try: 2, Epoch: 2}
	twice := sdk.Attempt{RunID: "run-b", TaskID: "load", Try: 1}
	cs := fake.NewClientset()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var pods []*corev1.Pod
	for i, x := range []sdk.Attempt{a, sameLabel, otherEpoch, otherTry, twice, twice} {
		p := taskPod("ns", i, x, start)
		p.Name = p.Name + "-" + string(rune('a'+i))
		pods = append(pods, p)
		if err := cs.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	p := startInformer(cs, "ns", 0, clock.Real{}, hclog.NewNullLogger(), cacheReducer().object)
	defer p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !p.waitSynced(ctx) {
		t.Fatal("the cache did not sync")
	}
	if got := p.byAttempt.len(); got != len(pods) {
		t.Fatalf("the lookup holds %d pods once synced, want %d", got, len(pods))
	}
	for x, want := range map[sdk.Attempt]int{a: 1, sameLabel: 1, otherEpoch: 1, otherTry: 1, twice: 2} {
		got := p.cached(x)
		if len(got) != want {
			t.Fatalf("the cache answers %d pods for %s, want %d", len(got), x, want)
		}
		for _, pd := range got {
			if !pd.labels.matches(x) {
				t.Fatalf("the cache answers for %s a pod of another attempt: %+v", x, pd.labels)
			}
			key := pd.Namespace + "/" + pd.Name
			if _, ok, err := p.informer.GetIndexer().GetByKey(key); !ok || err != nil {
				t.Fatalf("the cached pod of %s is not keyed %s: %v", x, key, err)
			}
		}
	}
	if got := p.cached(sdk.Attempt{RunID: "run-absent", TaskID: "load", Try: 1, Epoch: 2}); len(got) != 0 {
		t.Fatalf("an attempt with no pod is answered %d pods", len(got))
	}

	// a's pod relabelled to another attempt, one of twice's pods deleted.
	moved := sdk.Attempt{RunID: "run-c", TaskID: "load_a", Try: 1, Epoch: 2}
	relabelled := pods[0].DeepCopy()
	relabelled.Labels[LabelRunID] = moved.RunID
	if _, err := cs.CoreV1().Pods("ns").Update(ctx, relabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("ns").Delete(ctx, pods[5].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 30*time.Second, "the lookup to follow the relabel and the deletion", func() bool {
		return len(p.cached(a)) == 0 && len(p.cached(moved)) == 1 && len(p.cached(twice)) == 1
	})
	if got := p.cached(twice); got[0].Name != pods[4].Name {
		t.Fatalf("twice's remaining pod is %s, want %s", got[0].Name, pods[4].Name)
	}
	if got := p.byAttempt.len(); got != len(pods)-1 {
		t.Fatalf("the lookup holds %d pods, want %d", got, len(pods)-1)
	}
}

// The lookup's entries: one pod a hash in one, several in more, never
// both; a removal finds the pod of the same namespace and name under its
// labels' hash or, when its labels changed unseen, anywhere; an update
// replaces the old object with the new in one step.
func TestAttemptPodsEntries(t *testing.T) {
	t.Parallel()
	mk := func(name, run string) *pod {
		return &pod{podMeta: podMeta{Name: name, Namespace: "ns"},
			labels: podLabels{run: run, task: "t", try: "1", epoch: "0", hasEpoch: true}}
	}
	ap := newAttemptPods()
	x, y, z := mk("x", "r1"), mk("y", "r1"), mk("z", "r2")
	for _, p := range []*pod{x, y, z} {
		ap.add(p)
	}
	at := sdk.Attempt{RunID: "r1", TaskID: "t", Try: 1}
	if len(ap.one) != 1 || len(ap.more) != 1 || len(ap.of(at)) != 2 {
		t.Fatalf("one %d, more %d, pods of r1 %d: want 1, 1, 2", len(ap.one), len(ap.more), len(ap.of(at)))
	}
	ap.remove(mk("x", "r1")) // another object of the same key, as a watch's deletion hands it
	if len(ap.one) != 2 || len(ap.more) != 0 || len(ap.of(at)) != 1 || ap.of(at)[0] != y {
		t.Fatalf("after a removal: one %d, more %d: want r1's last pod back in one", len(ap.one), len(ap.more))
	}
	ap.remove(mk("z", "r9")) // its labels changed unseen: found by its key
	if ap.len() != 1 || len(ap.of(sdk.Attempt{RunID: "r2", TaskID: "t", Try: 1})) != 0 {
		t.Fatalf("a pod removed under other labels is still held (%d held)", ap.len())
	}
	ap.remove(mk("absent", "r1"))
	if ap.len() != 1 {
		t.Fatalf("removing an absent pod dropped another: %d held", ap.len())
	}
	// An update: the new object of y's key, relabelled to r3, in one step;
	// a resync hands the same object and changes nothing.
	y3 := mk("y", "r3")
	ap.replace(y, y3)
	ap.replace(y3, y3)
	if got := ap.of(sdk.Attempt{RunID: "r3", TaskID: "t", Try: 1}); ap.len() != 1 || len(got) != 1 || got[0] != y3 || len(ap.of(at)) != 0 {
		t.Fatalf("after an update: %d held, r3's %v, r1's %v", ap.len(), got, ap.of(at))
	}
	ap.replace(y3, nil)
	ap.replace(nil, x)
	if ap.len() != 1 || len(ap.of(at)) != 1 {
		t.Fatalf("an update to or from an object that is not a pod: %d held", ap.len())
	}
}

// The hash is FNV-1a 64 of the index key and a closing zero byte, the same
// for a pod's labels and the attempt they name.
func TestAttemptHashIsFNV1aOfTheIndexKey(t *testing.T) {
	t.Parallel()
	for _, a := range []sdk.Attempt{{}, {RunID: "run-1", TaskID: "load-a", Try: 1}, {RunID: "r", TaskID: "T_1", Try: 3, Epoch: 2}} {
		h := fnv.New64a()
		_, _ = h.Write([]byte(attemptIndexKey(a) + "\x00"))
		l, ann := AttemptLabels(a)
		p := &pod{labels: labelsOf(l, ann)}
		if got, want := hashOf(p), h.Sum64(); got != want {
			t.Errorf("hash of the pod of %s = %x, want %x", a, got, want)
		}
		ap := newAttemptPods()
		ap.add(p)
		if got := ap.of(a); len(got) != 1 || got[0] != p {
			t.Errorf("the pod of %s is not found by it: %v", a, got)
		}
		delete(l, LabelAttemptEpoch) // a pod from before the epoch label: epoch 0
		if a.Epoch == 0 {
			if got, want := hashOf(&pod{labels: labelsOf(l, ann)}), h.Sum64(); got != want {
				t.Errorf("hash of the epochless pod of %s = %x, want %x", a, got, want)
			}
		}
	}
}
