package kube

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dexaflow/reaper/sdk"
)

func deletedOf(t *testing.T, a sdk.Attempt) *corev1.Pod {
	t.Helper()
	l, ann := AttemptLabels(a)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + a.TaskID, Labels: l, Annotations: ann}}
}

func TestFeed_NamesDeletionsAfterTheCursor(t *testing.T) {
	t.Parallel()
	f := newFeed()
	f.brokenBy("the first list")
	start := f.since(sdk.FeedCursor{}, true).Cursor
	a, b := sdk.Attempt{RunID: "r", TaskID: "a", Try: 1, Epoch: 1}, sdk.Attempt{RunID: "r", TaskID: "b", Try: 2, Epoch: 1}
	f.deleted(reduce(deletedOf(t, a)))
	f.deleted(cache.DeletedFinalStateUnknown{Key: "ns/p-b", Obj: deletedOf(t, b)}) // a whole pod, as the watch missed it
	f.deleted(&corev1.Pod{})                                                       // no attempt labels: not a task pod
	ch := f.since(start, true)
	if !ch.Complete || !slices.Equal(ch.Gone, []sdk.Attempt{a, b}) || ch.Cursor.Seq != 2 {
		t.Fatalf("changes %+v", ch)
	}
	if ch := f.since(ch.Cursor, true); !ch.Complete || len(ch.Gone) != 0 {
		t.Fatalf("from the latest cursor: %+v", ch)
	}
}

func TestFeed_IncompleteAcrossABreakUnsyncedOrDropped(t *testing.T) {
	t.Parallel()
	f := newFeed()
	before := f.since(sdk.FeedCursor{}, true).Cursor
	if ch := f.since(before, false); ch.Complete {
		t.Fatal("an unsynced cache answered complete")
	}
	f.brokenBy("the cache lost its list or watch: EOF")
	if ch := f.since(before, true); ch.Complete || ch.Detail == "" || ch.Cursor.Generation == before.Generation {
		t.Fatalf("across a break: %+v", ch)
	}
	if ch := f.since(sdk.FeedCursor{Generation: "another substrate 0"}, true); ch.Complete {
		t.Fatal("another feed's cursor answered complete")
	}
	cur := f.since(sdk.FeedCursor{}, true).Cursor
	p := reduce(deletedOf(t, sdk.Attempt{RunID: "r", TaskID: "a", Try: 1, Epoch: 1}))
	for range maxFeedChanges + 1 {
		f.deleted(p)
	}
	if ch := f.since(cur, true); ch.Complete {
		t.Fatal("a cursor older than the feed keeps answered complete")
	}
	if ch := f.since(sdk.FeedCursor{Generation: cur.Generation, Seq: 1}, true); !ch.Complete || len(ch.Gone) != maxFeedChanges {
		t.Fatalf("from the oldest kept: complete %v, %d gone", ch.Complete, len(ch.Gone))
	}
}
