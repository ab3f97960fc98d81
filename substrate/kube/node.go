package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dexaflow/reaper/sdk"
)

// An unreachable node, and how the substrate tells one.
//
// The signal is the node's own Ready condition, which the node lifecycle
// controller owns: Unknown once the kubelet has stopped renewing the node
// for its grace period (the machine is off, partitioned, or its kubelet is
// gone), False when the kubelet reports itself not ready. Its
// lastTransitionTime says since when. Nothing the substrate concludes from
// it fails anything: it only lets the pod-lost reaper say why an attempt
// that never heartbeated is being deferred, since a container may still run
// on a node nobody hears from.
//
// The node is read live, on demand, and only for pods whose own status
// already hints at a lost node (quarantine, then authority): bound to a
// node, not finished, and either not Ready (the controller turns every pod
// of a silent node not Ready) or being deleted (an eviction by the taint
// manager, or anyone's delete, that only the node's kubelet could
// confirm). A healthy fleet costs no read at all, and the substrate needs
// only get on nodes: no cluster-wide list or watch, no second cache. Each
// node is read at most once per liveness call.

// nodeState is what one read of a node says.
type nodeState struct {
	gone   bool                   // no node object of that name
	ready  bool                   // Ready=True, or no Ready condition yet (no signal)
	status corev1.ConditionStatus // the Ready condition's status
	reason string                 // and its reason (NodeStatusUnknown, KubeletNotReady, ...)
	since  time.Time              // its lastTransitionTime
	err    error
}

// maxNodeReads bounds the node reads of one liveness call: a page of 100
// attempts on as many lost nodes is read whole, while pods someone bound to
// thousands of node names cannot turn one call into thousands of reads.
// Past it, an answer says its node could not be read (a deferral).
const maxNodeReads = 100

// maxNodeWords bounds how many pods an answer's detail describes.
const maxNodeWords = 5

// nodeReads reads the nodes of one liveness call, each at most once.
type nodeReads struct {
	r    *running
	seen map[string]nodeState
}

func newNodeReads(r *running) *nodeReads {
	return &nodeReads{r: r, seen: map[string]nodeState{}}
}

// read returns the state of node name, reading it live the first time.
func (n *nodeReads) read(ctx context.Context, name string) nodeState {
	if st, ok := n.seen[name]; ok {
		return st
	}
	if len(n.seen) >= maxNodeReads {
		return nodeState{err: fmt.Errorf("reading node %s: this call already read %d nodes, its bound", name, maxNodeReads)}
	}
	st := readNode(ctx, n.r, name)
	n.seen[name] = st
	return st
}

func readNode(ctx context.Context, r *running, name string) nodeState {
	node, err := r.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nodeState{gone: true}
	case err != nil:
		return nodeState{err: fmt.Errorf("reading node %s: %w", name, err)}
	}
	return nodeStateOf(node)
}

// nodeStateOf reads a node's Ready condition. A node with none (just
// registered) gives no signal: it counts as ready.
func nodeStateOf(node *corev1.Node) nodeState {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return nodeState{ready: c.Status == corev1.ConditionTrue, status: c.Status, reason: c.Reason,
				since: c.LastTransitionTime.Time}
		}
	}
	return nodeState{ready: true}
}

// mayBeOnLostNode: the pod may still run, and its own status hints that its
// node is lost.
func (p *pod) mayBeOnLostNode() bool {
	return p.node != "" && !finished(p.phase) && (!p.ready || p.DeletionTimestamp != nil)
}

// annotate sets the node fields of l, the alive answer about pods: Node and
// NodeUnreachableSince when every pod of the attempt may still run and is
// bound to a node that is not Ready (the latest transition among them),
// NodeError when a node could not be read. An attempt with a finished pod,
// a pod on a Ready node or a pod whose node is gone (Pod GC deletes such a
// pod) gets none.
func (n *nodeReads) annotate(ctx context.Context, l *sdk.AttemptLiveness, pods []*pod) {
	if l.State != sdk.Alive || len(pods) == 0 {
		return
	}
	for _, p := range pods {
		if !p.mayBeOnLostNode() {
			return
		}
	}
	var (
		names []string
		since time.Time
		words []string
	)
	for _, p := range pods {
		st := n.read(ctx, p.node)
		switch {
		case st.err != nil:
			l.NodeError = st.err.Error()
			return
		case st.gone:
			l.Detail += "; node " + p.node + " of pod " + p.Name + " is gone (Pod GC deletes its pods)"
			return
		case st.ready:
			return
		}
		if st.since.After(since) {
			since = st.since
		}
		if !contains(names, p.node) {
			names = append(names, p.node)
		}
		w := fmt.Sprintf("pod %s on node %s, Ready %s since %s", p.Name, p.node, st.status, st.since.UTC().Format(time.RFC3339))
		if st.reason != "" {
			w += " (" + st.reason + ")"
		}
		if p.DeletionTimestamp != nil {
			w += ", Terminating since " + p.DeletionTimestamp.UTC().Format(time.RFC3339) + " with no kubelet to confirm it"
		}
		words = append(words, w)
	}
	if len(words) > maxNodeWords {
		words = append(words[:maxNodeWords], fmt.Sprintf("and %d more pods", len(words)-maxNodeWords))
	}
	if len(names) > maxNodeWords {
		names = append(names[:maxNodeWords], fmt.Sprintf("and %d more", len(names)-maxNodeWords))
	}
	l.Node, l.NodeUnreachableSince = strings.Join(names, ","), since
	l.Detail += "; node not Ready: " + strings.Join(words, "; ")
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
