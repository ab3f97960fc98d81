package kube

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/sdk/clock"
)

// The attempt index is bucketed: a lookup reads a bucket that other
// attempts' pods share, and answers only the pods whose labels name the
// attempt asked about. The informer keys the slim cached pod by its
// namespace and name, as it keys a whole one.
func TestCachedAnswersOnlyTheAttemptsOwnPodsOfItsBucket(t *testing.T) {
	a := sdk.Attempt{RunID: "run-a", TaskID: "load", Try: 1, Epoch: 2}
	bucket := attemptBucket(attemptIndexKey(a))
	var neighbours []sdk.Attempt // attempts whose pods share a's bucket
	for i := 0; len(neighbours) < 3; i++ {
		n := sdk.Attempt{RunID: fmt.Sprintf("run-%d", i), TaskID: "load", Try: 1, Epoch: 2}
		if attemptBucket(attemptIndexKey(n)) == bucket {
			neighbours = append(neighbours, n)
		}
	}
	// The same run and task at another try or epoch: its own attempt, most
	// likely another bucket, never a's answer.
	other := sdk.Attempt{RunID: a.RunID, TaskID: a.TaskID, Try: 1, Epoch: 1}
	cs := fake.NewClientset()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i, x := range append([]sdk.Attempt{a, other}, neighbours...) {
		if err := cs.Tracker().Add(taskPod("ns", i, x, start)); err != nil {
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
	objs, err := p.informer.GetIndexer().ByIndex(attemptIndex, bucket)
	if err != nil || len(objs) < 1+len(neighbours) {
		t.Fatalf("bucket %s holds %d pods (%v), want a's and its %d neighbours'", bucket, len(objs), err, len(neighbours))
	}
	for _, x := range append([]sdk.Attempt{a, other}, neighbours...) {
		got := p.cached(x)
		if len(got) != 1 || !got[0].labels.matches(x) {
			t.Fatalf("the cache answers %d pods for %s, want its one pod", len(got), x)
		}
		key := got[0].Namespace + "/" + got[0].Name
		if _, ok, err := p.informer.GetIndexer().GetByKey(key); !ok || err != nil {
			t.Fatalf("the cached pod of %s is not keyed %s: %v", x, key, err)
		}
	}
	if got := p.cached(sdk.Attempt{RunID: "run-absent", TaskID: "load", Try: 1, Epoch: 2}); len(got) != 0 {
		t.Fatalf("an attempt with no pod is answered %d pods", len(got))
	}
}

// attemptBucket is FNV-1a of the index key, as hash/fnv spells it: the
// buckets of a running cache do not move when its code does.
func TestAttemptBucketIsFNV1a(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"", "run-1\x00load-a\x001\x000", attemptIndexKey(sdk.Attempt{RunID: "r", TaskID: "T_1", Try: 3, Epoch: 2})} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(k))
		if got, want := attemptBucket(k), strconv.FormatUint(uint64(h.Sum32()%attemptBuckets), 16); got != want {
			t.Errorf("attemptBucket(%q) = %s, want %s", k, got, want)
		}
	}
}
