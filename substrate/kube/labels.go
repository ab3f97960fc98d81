package kube

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/dexaflow/reaper/sdk"
)

// The names a task pod carries. The control plane writes them when it
// creates the pod; the task cannot change them. They are the
// specification's, so that its runbooks and kubectl selectors apply.
const (
	// LabelRunID is the run's id, verbatim (a run id is unique, so the
	// label alone selects every pod of one run).
	LabelRunID = "leoflow.io/run-id"
	// LabelTaskID is the task id, lossily (see TaskIDLabel).
	LabelTaskID = "leoflow.io/task-id"
	// LabelTryNumber is the attempt's try number, in decimal.
	LabelTryNumber = "leoflow.io/try-number"
	// LabelAttemptEpoch is the attempt's epoch, in decimal. A pod without
	// it was created before epochs existed and counts as epoch 0.
	LabelAttemptEpoch = "leoflow.io/attempt-epoch"
	// AnnotationRawTaskID is the exact task id. A pod without it was
	// created before the annotation existed and is matched on its labels
	// alone.
	AnnotationRawTaskID = "leoflow.io/raw-task-id"

	// TaskContainer is the name of the container that runs the task and
	// writes its durable outcome record. A pod with no container of that
	// name has its first container taken as the task's.
	TaskContainer = "task"

	// FinalizerOutcomeRecord is the finalizer the kube runner puts on every
	// task pod it creates (never on a warm worker pod, which serves many
	// attempts): a deletion (a user's, Pod GC's, an eviction's) then leaves
	// the pod object, with its task container's outcome record, until the
	// sweep has settled it and removes the finalizer (finalizer.go).
	FinalizerOutcomeRecord = "leoflow.io/outcome-record"
)

// TaskIDLabel is the value of LabelTaskID for a task id: lowercased, with
// "_" and "." turned into "-". It is lossy (load_a and load-a, or Load and
// load, share one value), which is why AnnotationRawTaskID exists.
func TaskIDLabel(taskID string) string {
	// Most task ids are their own label already: every liveness lookup
	// spells one, so that case costs no allocation.
	plain := true
	for i := 0; i < len(taskID) && plain; i++ {
		c := taskID[i]
		plain = c < 0x80 && c != '_' && c != '.' && (c < 'A' || c > 'Z')
	}
	if plain {
		return taskID
	}
	return strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(taskID))
}

// AttemptLabels are the labels and annotations a pod of attempt a carries:
// what the kube runner writes and what this substrate matches.
func AttemptLabels(a sdk.Attempt) (labels, annotations map[string]string) {
	return map[string]string{
			LabelRunID:        a.RunID,
			LabelTaskID:       TaskIDLabel(a.TaskID),
			LabelTryNumber:    strconv.Itoa(int(a.Try)),
			LabelAttemptEpoch: strconv.Itoa(int(a.Epoch)),
		}, map[string]string{
			AnnotationRawTaskID: a.TaskID,
		}
}

// PodAttempt reads the attempt a pod's labels and annotations name (the
// reverse of AttemptLabels; a pod from before the raw task id annotation
// names its task by the lossy label). ok is false when the pod names no
// attempt: a label missing or malformed, or the annotation contradicting
// the label.
func PodAttempt(labels, annotations map[string]string) (a sdk.Attempt, ok bool) {
	return labelsOf(labels, annotations).attempt()
}

// podLabels is what a pod's labels and annotation say about the attempt
// it runs, as the pod carries them.
type podLabels struct {
	run, task, try, epoch, raw string
	hasEpoch, hasRaw           bool
}

// labelsOf reads a pod's attempt labels and raw task id annotation.
func labelsOf(l, ann map[string]string) podLabels {
	p := podLabels{run: l[LabelRunID], task: l[LabelTaskID], try: l[LabelTryNumber]}
	p.epoch, p.hasEpoch = l[LabelAttemptEpoch]
	p.raw, p.hasRaw = ann[AnnotationRawTaskID]
	return p
}

// attempt reads the attempt the labels name. The task id is the
// annotation's when there is one, else the (lossy) label's, which is all a
// pod from before the annotation can say. ok is false when a label is
// missing or malformed, or the annotation contradicts the label: such a
// pod names no attempt.
func (p podLabels) attempt() (sdk.Attempt, bool) {
	if p.run == "" || p.task == "" || p.try == "" {
		return sdk.Attempt{}, false
	}
	t, err := strconv.ParseInt(p.try, 10, 32)
	if err != nil {
		return sdk.Attempt{}, false
	}
	var epoch int64
	if p.hasEpoch {
		if epoch, err = strconv.ParseInt(p.epoch, 10, 32); err != nil {
			return sdk.Attempt{}, false
		}
	}
	task := p.task
	if p.hasRaw {
		if TaskIDLabel(p.raw) != p.task {
			return sdk.Attempt{}, false
		}
		task = p.raw
	}
	return sdk.Attempt{RunID: p.run, TaskID: task, Try: int32(t), Epoch: int32(epoch)}, true
}

// matches reports whether the pod belongs to exactly attempt a: the run,
// the lossy task label and (when the pod has it) the raw task id
// annotation, the try, and the epoch (none counting as 0).
func (p podLabels) matches(a sdk.Attempt) bool {
	if p.run != a.RunID || p.task != TaskIDLabel(a.TaskID) || (p.hasRaw && p.raw != a.TaskID) {
		return false
	}
	if p.try != strconv.Itoa(int(a.Try)) {
		return false
	}
	if !p.hasEpoch {
		return a.Epoch == 0
	}
	return p.epoch == strconv.Itoa(int(a.Epoch))
}

// indexKey is the cache's index value for the pod: the attempt as its
// labels spell it, the task id lossy. Pods of attempts whose task ids
// collide share a key; matches tells them apart.
func (p podLabels) indexKey() string {
	epoch := p.epoch
	if !p.hasEpoch {
		epoch = "0"
	}
	return p.run + "\x00" + p.task + "\x00" + p.try + "\x00" + epoch
}

// attemptIndexKey is indexKey for attempt a.
func attemptIndexKey(a sdk.Attempt) string {
	return a.RunID + "\x00" + TaskIDLabel(a.TaskID) + "\x00" + strconv.Itoa(int(a.Try)) + "\x00" + strconv.Itoa(int(a.Epoch))
}

// taskPodSelector selects every task pod: those with a run-id label.
func taskPodSelector() labels.Selector {
	r, err := labels.NewRequirement(LabelRunID, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("kube: the task pod selector: %v", err)) // a constant: cannot fail
	}
	return labels.NewSelector().Add(*r)
}

// attemptsSelector is one set-based selector that selects every pod of the
// given attempts (and possibly pods of their neighbours, which exact
// matching then drops): run-id in (...), task-id in (...).
func attemptsSelector(as []sdk.Attempt) (labels.Selector, error) {
	runs, tasks := map[string]bool{}, map[string]bool{}
	var runList, taskList []string
	for _, a := range as {
		if !runs[a.RunID] {
			runs[a.RunID] = true
			runList = append(runList, a.RunID)
		}
		if t := TaskIDLabel(a.TaskID); !tasks[t] {
			tasks[t] = true
			taskList = append(taskList, t)
		}
	}
	rr, err := labels.NewRequirement(LabelRunID, selection.In, runList)
	if err != nil {
		return nil, fmt.Errorf("selecting pods by run id: %w", err)
	}
	tr, err := labels.NewRequirement(LabelTaskID, selection.In, taskList)
	if err != nil {
		return nil, fmt.Errorf("selecting pods by task id: %w", err)
	}
	return labels.NewSelector().Add(*rr, *tr), nil
}

// runSelector selects every pod of one run.
func runSelector(runID string) (labels.Selector, error) {
	r, err := labels.NewRequirement(LabelRunID, selection.Equals, []string{runID})
	if err != nil {
		return nil, fmt.Errorf("selecting the pods of run %q: %w", runID, err)
	}
	return labels.NewSelector().Add(*r), nil
}
