package kubetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// BinderConfig configures a Binder.
type BinderConfig struct {
	// Client reaches the API server; it needs list and patch on pods and
	// create on pods/binding in Namespace. Required.
	Client kubernetes.Interface
	// Namespace is the namespace whose pods are bound. Required.
	Namespace string
	// Nodes are the nodes the binder starts with (AddNode adds more).
	Nodes []string
	// Place picks the node for pod p among nodes (the live ones, oldest
	// first, never empty); "" leaves the pod unbound this round. Nil
	// places every pod on the newest node.
	Place func(p *corev1.Pod, nodes []string) string
	// Labels are set on each pod before it is bound (for example the
	// kubelet player's owner label), when the pod lacks them.
	Labels map[string]string
	// Every is how often the unbound pods are listed; default 100ms.
	Every time.Duration
	// Timeout bounds each round's requests (a paused API server answers
	// nothing); default 5s.
	Timeout time.Duration
}

// Binder plays kube-scheduler, which the test cluster does not run: every
// round it lists the namespace's pods without a node and binds each one
// not being deleted (in name order) to the node Place picks among the live
// nodes. Errors are left for the next round: a pod already bound, or one
// deleted meanwhile, is simply no longer listed.
type Binder struct {
	cfg    BinderConfig
	mu     sync.Mutex // guards nodes; held across a round's bindings
	nodes  []string
	cancel context.CancelFunc
	done   chan struct{}
}

// StartBinder starts a binder; it runs until ctx ends or Stop.
func StartBinder(ctx context.Context, cfg BinderConfig) (*Binder, error) {
	if cfg.Client == nil || cfg.Namespace == "" {
		return nil, errors.New("binder: Client and Namespace are required")
	}
	if cfg.Place == nil {
		cfg.Place = func(_ *corev1.Pod, nodes []string) string { return nodes[len(nodes)-1] }
	}
	if cfg.Every <= 0 {
		cfg.Every = 100 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	b := &Binder{cfg: cfg, nodes: append([]string(nil), cfg.Nodes...), cancel: cancel, done: make(chan struct{})}
	go b.loop(ctx)
	return b, nil
}

// Stop stops the binder and waits for its round to end.
func (b *Binder) Stop() {
	b.cancel()
	<-b.done
}

// AddNode adds a node pods may be bound to.
func (b *Binder) AddNode(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nodes = append(b.nodes, name)
}

// RemoveNode takes a node off the binder's list. Once it returns, no pod
// is bound to that node any more (a round holds the list across its
// bindings), so a node about to be deleted receives nothing new.
func (b *Binder) RemoveNode(name string) {
	b.TakeNode(func([]string) string { return name })
}

// TakeNode removes the node pick names among the live nodes (oldest
// first), as one step: two callers never take the same node. It returns
// that node, or "" when pick names none of them.
func (b *Binder) TakeNode(pick func(nodes []string) string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	name := pick(append([]string(nil), b.nodes...))
	for i, n := range b.nodes {
		if n == name {
			b.nodes = append(b.nodes[:i:i], b.nodes[i+1:]...)
			return name
		}
	}
	return ""
}

// Nodes returns the live nodes, oldest first.
func (b *Binder) Nodes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.nodes...)
}

func (b *Binder) loop(ctx context.Context) {
	defer close(b.done)
	tk := time.NewTicker(b.cfg.Every)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		b.round(ctx)
	}
}

// round binds the pods that have no node.
func (b *Binder) round(ctx context.Context) {
	if len(b.Nodes()) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	pods := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace)
	// ResourceVersion "0": the API server's watch cache answers, so a
	// round costs little however many pods the namespace holds; a pod it
	// still shows unbound is refused at Bind and left alone.
	list, err := pods.List(ctx, metav1.ListOptions{ResourceVersion: "0",
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", "").String()})
	if err != nil || len(list.Items) == 0 {
		return
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil || p.Spec.NodeName != "" || len(b.nodes) == 0 {
			continue
		}
		node := b.cfg.Place(p, append([]string(nil), b.nodes...))
		if node == "" {
			continue
		}
		_ = b.bind(ctx, p, node)
	}
}

// bind labels the pod as configured and binds it to node.
func (b *Binder) bind(ctx context.Context, p *corev1.Pod, node string) error {
	pods := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace)
	missing := map[string]string{}
	for k, v := range b.cfg.Labels {
		if p.Labels[k] != v {
			missing[k] = v
		}
	}
	if len(missing) > 0 {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": missing}})
		if err != nil {
			return fmt.Errorf("label pod %s: %w", p.Name, err)
		}
		if _, err := pods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label pod %s: %w", p.Name, err)
		}
	}
	err := pods.Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("bind pod %s to %s: %w", p.Name, node, err)
	}
	return nil
}
