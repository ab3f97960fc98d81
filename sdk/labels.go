package sdk

import (
	"fmt"
	"slices"
)

// Decision labels. Each is the value of the decision_type label of
// dexaflow_scheduler_decisions_total and of the label column of the audit.
// The specification's labels are kept verbatim so that its dashboards and
// runbooks apply; the project's own additions are grouped at the end.
const (
	// The leader-settling gate.
	LabelSettlingSkip      = "reap_settling_skip"
	LabelSettlingValveOpen = "reap_settling_valve_open"

	// agentlost: heartbeat silence in the current attempt.
	LabelAgentLost                 = "agent_lost"
	LabelAgentLostProcessAlive     = "agent_lost_process_alive"
	LabelAgentLostProcessQueryErr  = "agent_lost_process_query_error"
	LabelAgentLostOrphanStopped    = "agent_lost_orphan_stopped"
	LabelAgentLostOrphanStopErr    = "agent_lost_orphan_stop_error"
	LabelAgentLostPodDeleteErr     = "agent_lost_pod_delete_error"
	LabelAgentLostNeverHeartbeated = "agent_lost_never_heartbeated"
	// Lite: a running attempt that never heartbeated is judged only on
	// positive death of both agent and task group.
	LabelAgentLostNeverHeartbeatedProcessAlive    = "agent_lost_never_heartbeated_process_alive"
	LabelAgentLostNeverHeartbeatedProcessQueryErr = "agent_lost_never_heartbeated_process_query_error"

	// The credential ceiling (a task failure, not an infra mark).
	LabelCredentialCeiling = "credential_ceiling"

	// dispatchlost.
	LabelDispatchLost                = "dispatch_lost"
	LabelDispatchLostProcessAlive    = "dispatch_lost_process_alive"
	LabelDispatchLostProcessQueryErr = "dispatch_lost_process_query_error"
	LabelDispatchLostPodQueryErr     = "dispatch_lost_pod_query_error"
	LabelDispatchLostOrphanStopped   = "dispatch_lost_orphan_stopped"
	LabelDispatchLostOrphanStopErr   = "dispatch_lost_orphan_stop_error"
	LabelDispatchLostPodDeleteErr    = "dispatch_lost_pod_delete_error"
	LabelStartExpired                = "start_expired"

	// podlost (kube).
	LabelPodLost             = "pod_lost"
	LabelPodLostPodQueryErr  = "pod_lost_pod_query_error"
	LabelPodLostPodDeleteErr = "pod_lost_pod_delete_error"

	// orphanrun.
	LabelOrphanReapNoop = "orphan_reap_noop"

	// Teardown and the reconciler (kube).
	LabelTeardownDeleteFallback   = "reap_teardown_delete_fallback"
	LabelInfraConfirmValveOpen    = "infra_confirm_valve_open"
	LabelDispatchUnavailable      = "dispatch_unavailable"
	LabelDispatchUnavailableSpent = "dispatch_unavailable_exhausted"

	// The project's own labels (not in the specification).

	// LabelOrphanRun: a run with nothing live and no activity was failed.
	LabelOrphanRun = "orphan_run"
	// LabelOrphanRunPodDeleteErr: the run stays failed, but tearing down
	// its executions failed (the pods' own deadlines and the reconciler's
	// collection remain the backstops).
	LabelOrphanRunPodDeleteErr = "orphan_run_pod_delete_error"
	// LabelWarmWorkerLost: an attempt's warm worker is gone (kube warm pool).
	LabelWarmWorkerLost = "warm_worker_lost"
	// LabelWarmWorkerListErr: the live LIST of warm pods failed; the pass
	// made no marks.
	LabelWarmWorkerListErr = "warm_worker_list_error"
	// LabelWarmRequeue: a queued warm attempt whose worker will not start
	// it (its pod is going, finished or gone) was offered again on the
	// warm requeue rail (the kube runner).
	LabelWarmRequeue = "warm_requeue"
	// LabelDispatchLostPodAlive: a Pending or Running pod of the attempt
	// exists, so the dispatch landed.
	LabelDispatchLostPodAlive = "dispatch_lost_pod_alive"
	// LabelPodLostPodPresent: the attempt's pod exists.
	LabelPodLostPodPresent = "pod_lost_pod_present"
	// LabelPodLostNodeUnreachable: an attempt that never heartbeated has
	// pods only on a node that has not been Ready for longer than podlost's
	// node_unreachable_after (or that are Terminating there, no kubelet
	// left to confirm it). Its container may still run, so nothing is
	// failed; the operator confirms the machine is off and lets the cluster
	// delete the pods (the out-of-service taint), after which pod_lost
	// follows on its own signal.
	LabelPodLostNodeUnreachable = "pod_lost_node_unreachable"
	// LabelInfraConfirmValveHeld: an unconfirmed infra mark past its
	// confirmation valve was not acted on, because the kube runner read
	// that the attempt's pod may still run: on a node that is not Ready
	// (no teardown reaches it; a re-place would run the task again beside
	// it once the node is back), or while the attempt's teardown is owed
	// (the stop and the delete keep failing) and its pod has not ended,
	// or could not be read. It waits for the node, the pod's end (a
	// completed retry of the teardown, the pod's own deadline), the node's
	// deletion, an out-of-service taint, a forced delete or an operator's
	// mark.
	LabelInfraConfirmValveHeld = "infra_confirm_valve_held"
	// LabelMarkNoop: a guarded mark changed nothing because the attempt moved
	// on (another try, epoch or state), heartbeated again, or the term is no
	// longer current.
	LabelMarkNoop = "reap_mark_noop"
	// LabelBrakeEngaged: marks decided on silence alone exceeded the brake.
	LabelBrakeEngaged = "reap_brake_engaged"
	// LabelPluginUnavailable: a plugin could not be called this cycle.
	LabelPluginUnavailable = "plugin_unavailable"
	// LabelPassError: a reaper's pass ended in an error.
	LabelPassError = "reap_pass_error"
	// LabelTeardownRetried: a teardown owed since a reaper's own failed
	// (the host's retry, on any later cycle) completed: nothing of the
	// reaped attempt or run is left running.
	LabelTeardownRetried = "reap_teardown_retried"
	// LabelTeardownOwedError: a retry of a teardown owed by a reaper that
	// has no *_pod_delete_error label of its own failed again.
	LabelTeardownOwedError = "reap_teardown_owed_error"

	// The Lite runner's rails (runner/literunner). The two failures are
	// also the failure_reason the runner writes when it ends a task for good.

	// LabelTaskRetry: a task failure with retries left started its next try.
	LabelTaskRetry = "task_retry"
	// LabelInfraReplace: an infra failure was re-placed on a new epoch, on
	// the infra budget, the task's retries untouched.
	LabelInfraReplace = "infra_replace"
	// LabelInfraBudgetSpent: an infra failure whose infra budget is spent was
	// failed for good.
	LabelInfraBudgetSpent = "infra_budget_spent"
	// LabelDispatchFailed: the executor could not start the attempt and the
	// error does not call for another offer: failed for good, retries kept
	// out of it.
	LabelDispatchFailed = "dispatch_failed"
	// LabelPodNameSquatted: the kube runner's pod create met a pod it did
	// not make already under the attempt's pod name (someone with
	// pods/create guessed or took the name first). The pod is left alone,
	// never adopted, and the attempt fails on the infra rail (confirmed, so
	// the next cycle re-places it under a new name, on its infra budget).
	// The evidence names the pod, its UID and whether its labels name the
	// attempt.
	LabelPodNameSquatted = "pod_name_squatted"

	// The runners' graph and finalize steps (runner/internal/steps).

	// LabelUpstreamFailed: a task waiting in state none was settled
	// upstream_failed because one of its upstreams failed for good (a task
	// failure with no retries left, an infra failure made terminal, or an
	// upstream_failed of its own). The evidence names those upstreams.
	LabelUpstreamFailed = "upstream_failed"
	// LabelUpstreamSkipped: a task waiting in state none was skipped
	// because one of its upstreams was skipped and none failed.
	LabelUpstreamSkipped = "upstream_skipped"
	// LabelRunFinalizedSuccess: a running run whose task instances had all
	// succeeded or been skipped was finished success.
	LabelRunFinalizedSuccess = "run_finalized_success"
	// LabelRunFinalizedFailed: a running run whose task instances were all
	// settled, one or more of them unsuccessfully, was finished failed; the
	// evidence names the unsuccessful tasks.
	LabelRunFinalizedFailed = "run_finalized_failed"

	// The kube reconcile sweep (substrate/kube).

	// LabelReconcileSettled: a finished pod's attempt was settled from its
	// durable outcome record or the cluster's word.
	LabelReconcileSettled = "reconcile_settled"
	// LabelReconcileInfraConfirmed: a provisional infra mark was confirmed:
	// nothing of its attempt runs on.
	LabelReconcileInfraConfirmed = "reconcile_infra_confirmed"
	// LabelReconcileInfraOverride: a durable SUCCESS record settled the
	// attempt over its provisional infra mark.
	LabelReconcileInfraOverride = "reconcile_infra_override"
	// LabelReconcileFinalizerLeak: the sweep removed the outcome record
	// finalizer of a task pod that the ordinary release had not (its
	// attempt long settled, its deletion never confirmed by a kubelet, or
	// the pod past the substrate's finalizer_max_age); the evidence says
	// which.
	LabelReconcileFinalizerLeak = "reconcile_finalizer_leak"
	// LabelForeignTaskPod: a pod carries an attempt's task labels but is
	// not the pod recorded on the attempt (another UID): someone else made
	// it. It was ignored for judgment (it settles nothing, keeps nothing
	// alive, is never torn down) and, in the runner, never adopted. One
	// decision per pod UID; the evidence names the pod and both UIDs.
	LabelForeignTaskPod = "foreign_task_pod"
	// LabelExchangeNotFromPod: the attempt API refused the exchange of a
	// kube attempt's (or a warm worker's) bootstrap credential because the
	// call did not prove it came from the pod the board recorded: no pod
	// token, a token the cluster does not authenticate for the API's
	// audience, another ServiceAccount's, or another pod's. Nothing was
	// written and the bootstrap stays unspent for the pod's own agent; the
	// evidence says why and names both UIDs.
	LabelExchangeNotFromPod = "exchange_not_from_pod"

	// The operator (reaperctl).

	// LabelOperatorMark: an operator marked an attempt failed or success
	// (reaperctl mark): a verdict, not a guess, so no infra re-place and no
	// durable-SUCCESS override touches it; the operator's name is in the
	// evidence.
	LabelOperatorMark = "operator_mark"
	// LabelOperatorRelease: an operator lifted the hold of an attempt held
	// for review (reaperctl release); the operator's name is in the
	// evidence.
	LabelOperatorRelease = "operator_release"
	// LabelOperatorSubmit: an operator submitted a run (reaperctl submit);
	// a decision about the run, the operator's name and the task count in
	// the evidence.
	LabelOperatorSubmit = "operator_submit"

	// The board as a boundary (host/audit): writes a plugin asked for and
	// the board or the host refused, audited by the host whatever the
	// plugin records, with what was asked as the evidence.

	// LabelBoardRefusedSourceState: a mark or a settlement named a source
	// state its kind may not move an attempt from (a terminal state above
	// all): refused whole, nothing written.
	LabelBoardRefusedSourceState = "board_refused_source_state"
	// LabelBoardRefusedRunFinished: a mark named an attempt of a run that
	// is no longer running: nothing written.
	LabelBoardRefusedRunFinished = "board_refused_run_finished"
	// LabelBoardRefusedPassClosed: a write (a mark, a run reap, a try log
	// line, a reconciler's write) reached the host after its pass was
	// closed: nothing written.
	LabelBoardRefusedPassClosed = "board_refused_pass_closed"
	// LabelPluginReplyTooLarge: a plugin's reply was larger than the host
	// accepts (plugin_max_reply): refused unread, and the pass or sweep
	// went on without it.
	LabelPluginReplyTooLarge = "plugin_reply_too_large"
	// LabelBoardRefusedFenceTime: a write's At was not its pass's time
	// (backdated, or ahead of the host's clock): refused, nothing written.
	// The host fences every write at its own clock.
	LabelBoardRefusedFenceTime = "board_refused_fence_time"
	// LabelBoardRefusedConfirm: a reaper's mark asked to be confirmed as
	// it was made: refused, nothing written. Confirmation is the sweep's.
	LabelBoardRefusedConfirm = "board_refused_confirm"
	// LabelBoardRefusedForeignReaper: a plugin recorded a decision under
	// another reaper's name: not audited under it; this decision, under
	// the plugin's own name, says so.
	LabelBoardRefusedForeignReaper = "board_refused_foreign_reaper"
	// LabelBoardRefusedUndeclaredLabel: a plugin recorded a decision under
	// a label it did not declare (Info.DecisionLabels, AllowedLabels): not
	// metered nor audited under it; this decision says so.
	LabelBoardRefusedUndeclaredLabel = "board_refused_undeclared_label"

	// Reschedule is a sensor's, and bounded (the board's own judgment of a
	// report or record that asks for up_for_reschedule; each is also the
	// failure_reason and the start of the error_message).

	// LabelRescheduleNotSensor: a task not declared a sensor reported (or
	// left a record saying) up_for_reschedule: failed as a task failure
	// instead of parked; its retry policy applies.
	LabelRescheduleNotSensor = "reschedule_not_sensor"
	// LabelSensorTimeout: a sensor asked for another poke past its own
	// timeout, counted from the first poke of its try: failed, its retries
	// spent.
	LabelSensorTimeout = "sensor_timeout"
	// LabelSensorCredentialCeiling: a sensor asked for another poke past
	// the credential ceiling counted from the first dispatch of its try
	// (not from the poke's own credential): failed as a task failure; its
	// retry policy applies.
	LabelSensorCredentialCeiling = "sensor_credential_ceiling"
)

// Shadow verdicts: what became of an attempt a decision said was lost, once
// the board knows. A dry-run decision (or one under policy = "hold", or a
// provisional kube mark a durable SUCCESS can still override) is scored
// with one of them, beside the decision in the audit (reap_decisions.verdict)
// and in reaper_shadow_verdicts_total{verdict}.
const (
	// VerdictWouldHaveKilledLiveWork: after the decision the attempt
	// heartbeated, reported running or an outcome, or succeeded (a durable
	// SUCCESS over the mark included): failing it would have failed live
	// work.
	VerdictWouldHaveKilledLiveWork = "would_have_killed_live_work"
	// VerdictRight: the attempt never came back, and it was settled lost by
	// another path (an applied infra mark, the reconciler, the credential
	// ceiling), its mark was confirmed, or its run failed.
	VerdictRight = "right"
	// VerdictUnresolved: no truth arrived within the horizon, or none can
	// arrive any more (the attempt was released without either).
	VerdictUnresolved = "unresolved"
)

// Verdicts lists the verdict words, for the audit's CHECK, the metric and
// reaperctl shadow.
func Verdicts() []string {
	return []string{VerdictWouldHaveKilledLiveWork, VerdictRight, VerdictUnresolved}
}

// KillLabels are the labels of decisions that fail an attempt: in a dry run,
// what the reaper would have done. The shadow scorer judges these.
func KillLabels() []string {
	return append(ProvisionalLabels(), LabelCredentialCeiling)
}

// ProvisionalLabels are the kill labels whose mark is an infra mark, which
// on kube stays provisional until the reconciler confirms it, and which a
// durable SUCCESS still overrides: an applied one is scored too.
func ProvisionalLabels() []string {
	return []string{
		LabelAgentLost, LabelAgentLostNeverHeartbeated, LabelAgentLostOrphanStopped,
		LabelDispatchLost, LabelDispatchLostOrphanStopped, LabelStartExpired,
		LabelPodLost, LabelWarmWorkerLost,
	}
}

// Labels lists every label above, for registering metrics ahead of the
// first decision and for documentation.
func Labels() []string {
	return []string{
		LabelSettlingSkip, LabelSettlingValveOpen,
		LabelAgentLost, LabelAgentLostProcessAlive, LabelAgentLostProcessQueryErr,
		LabelAgentLostOrphanStopped, LabelAgentLostOrphanStopErr, LabelAgentLostPodDeleteErr,
		LabelAgentLostNeverHeartbeated, LabelAgentLostNeverHeartbeatedProcessAlive,
		LabelAgentLostNeverHeartbeatedProcessQueryErr,
		LabelCredentialCeiling,
		LabelDispatchLost, LabelDispatchLostProcessAlive, LabelDispatchLostProcessQueryErr,
		LabelDispatchLostPodQueryErr, LabelDispatchLostOrphanStopped, LabelDispatchLostOrphanStopErr,
		LabelDispatchLostPodDeleteErr, LabelStartExpired,
		LabelPodLost, LabelPodLostPodQueryErr, LabelPodLostPodDeleteErr,
		LabelOrphanReapNoop,
		LabelTeardownDeleteFallback, LabelInfraConfirmValveOpen, LabelInfraConfirmValveHeld,
		LabelDispatchUnavailable, LabelDispatchUnavailableSpent,
		LabelOrphanRun, LabelOrphanRunPodDeleteErr, LabelWarmWorkerLost, LabelWarmWorkerListErr, LabelWarmRequeue,
		LabelDispatchLostPodAlive, LabelPodLostPodPresent, LabelPodLostNodeUnreachable, LabelMarkNoop,
		LabelBrakeEngaged, LabelPluginUnavailable, LabelPassError,
		LabelTeardownRetried, LabelTeardownOwedError,
		LabelTaskRetry, LabelInfraReplace, LabelInfraBudgetSpent, LabelDispatchFailed, LabelPodNameSquatted,
		LabelUpstreamFailed, LabelUpstreamSkipped, LabelRunFinalizedSuccess, LabelRunFinalizedFailed,
		LabelReconcileSettled, LabelReconcileInfraConfirmed, LabelReconcileInfraOverride,
		LabelOperatorMark, LabelOperatorRelease, LabelOperatorSubmit,
		LabelReconcileFinalizerLeak,
		LabelBoardRefusedSourceState, LabelBoardRefusedRunFinished, LabelBoardRefusedPassClosed,
		LabelPluginReplyTooLarge,
		LabelBoardRefusedFenceTime, LabelBoardRefusedConfirm,
		LabelBoardRefusedForeignReaper, LabelBoardRefusedUndeclaredLabel,
		LabelForeignTaskPod, LabelExchangeNotFromPod,
		LabelRescheduleNotSensor, LabelSensorTimeout, LabelSensorCredentialCeiling,
	}
}

// CommonLabels are the labels any reaper may record without declaring
// them: those the sdk's own helpers (sdk/reap) record on a reaper's behalf,
// none of which fails an attempt. A plugin that declares nothing (one built
// before Info.DecisionLabels) may record these and its mark reasons only:
// the host cannot tell which other labels such a plugin means, and a kill
// label it never declared would be scored and alerted on as if it had.
func CommonLabels() []string {
	return []string{LabelMarkNoop, LabelTeardownDeleteFallback, LabelBrakeEngaged}
}

// SweepLabels are the labels a substrate's sweep may record without
// declaring them: the reconciler's own, and the board's refusals of a
// reschedule it settles (MarkResult.RescheduleRefused).
func SweepLabels() []string {
	return []string{LabelReconcileSettled, LabelReconcileInfraConfirmed, LabelReconcileInfraOverride,
		LabelReconcileFinalizerLeak, LabelForeignTaskPod, LabelWarmWorkerListErr,
		LabelRescheduleNotSensor, LabelSensorTimeout, LabelSensorCredentialCeiling}
}

// MaxDeclaredLabels bounds the decision labels and mark reasons one plugin
// declares, and so the metric series it can open.
const MaxDeclaredLabels = 64

// HostLabels are the labels only the host, its runners, the operator and
// the substrate's sweep record: no reaper plugin may declare one.
func HostLabels() []string {
	return []string{
		LabelSettlingSkip, LabelSettlingValveOpen,
		LabelPluginUnavailable, LabelPassError, LabelPluginReplyTooLarge,
		LabelTeardownRetried, LabelTeardownOwedError,
		LabelTaskRetry, LabelInfraReplace, LabelInfraBudgetSpent, LabelDispatchFailed,
		LabelDispatchUnavailable, LabelDispatchUnavailableSpent, LabelWarmRequeue,
		LabelUpstreamFailed, LabelUpstreamSkipped, LabelRunFinalizedSuccess, LabelRunFinalizedFailed,
		LabelReconcileSettled, LabelReconcileInfraConfirmed, LabelReconcileInfraOverride,
		LabelReconcileFinalizerLeak, LabelForeignTaskPod,
		LabelInfraConfirmValveOpen, LabelInfraConfirmValveHeld,
		LabelOperatorMark,
		LabelBoardRefusedSourceState, LabelBoardRefusedRunFinished, LabelBoardRefusedPassClosed,
		LabelBoardRefusedFenceTime, LabelBoardRefusedConfirm,
		LabelBoardRefusedForeignReaper, LabelBoardRefusedUndeclaredLabel,
		LabelRescheduleNotSensor, LabelSensorTimeout, LabelSensorCredentialCeiling,
	}
}

// LabelWord reports whether s can be a decision label: a lowercase letter,
// then lowercase letters, digits and underscores, at most 64 bytes.
func LabelWord(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// CheckDeclared checks a reaper plugin's declaration (Info.DecisionLabels
// and Info.MarkReasons): at most MaxDeclaredLabels words (LabelWord), none
// of them a host's label (HostLabels); its KillLabels among them, and its
// ProvisionalLabels among its KillLabels. The host refuses to launch a
// plugin whose declaration fails it.
func CheckDeclared(info Info) error {
	if n := len(info.DecisionLabels) + len(info.MarkReasons); n > MaxDeclaredLabels {
		return fmt.Errorf("declares %d decision labels and mark reasons, more than %d", n, MaxDeclaredLabels)
	}
	host := HostLabels()
	for _, l := range append(slices.Clone(info.DecisionLabels), info.MarkReasons...) {
		switch {
		case !LabelWord(l):
			return fmt.Errorf("declares %.80q, which is no label (lowercase letters, digits and underscores, at most 64 bytes)", l)
		case slices.Contains(host, l):
			return fmt.Errorf("declares %q, a label only the host records", l)
		}
	}
	for _, l := range info.KillLabels {
		if !slices.Contains(info.MarkReasons, l) && !slices.Contains(info.DecisionLabels, l) {
			return fmt.Errorf("declares %.80q a kill label, which is none of its mark reasons and decision labels", l)
		}
	}
	for _, l := range info.ProvisionalLabels {
		if !slices.Contains(info.KillLabels, l) {
			return fmt.Errorf("declares %.80q a provisional label, which is none of its kill labels", l)
		}
	}
	return nil
}

// DeclaredKillLabels returns the kill labels and provisional labels of a
// reaper plugin, what the host scores of its decisions and opens verdict
// series for: those it declared (Info.KillLabels, Info.ProvisionalLabels),
// none when its declaration fails CheckDeclared, and for a plugin that
// declares no kill label (one built before the field) the sdk's built-in
// ones (KillLabels, ProvisionalLabels) among the labels it declared.
func DeclaredKillLabels(info Info) (kill, provisional []string) {
	if CheckDeclared(info) != nil {
		return nil, nil
	}
	if len(info.KillLabels) > 0 {
		return slices.Clone(info.KillLabels), slices.Clone(info.ProvisionalLabels)
	}
	declared := func(l string) bool {
		return slices.Contains(info.MarkReasons, l) || slices.Contains(info.DecisionLabels, l)
	}
	for _, l := range KillLabels() {
		if declared(l) {
			kill = append(kill, l)
		}
	}
	for _, l := range ProvisionalLabels() {
		if declared(l) {
			provisional = append(provisional, l)
		}
	}
	return kill, provisional
}

// AllowedLabels is the set of labels the host meters and audits a reaper
// plugin's decisions under: what it declared (Info.DecisionLabels and
// Info.MarkReasons, when CheckDeclared passes) and CommonLabels.
func AllowedLabels(info Info) map[string]bool {
	out := map[string]bool{}
	for _, l := range CommonLabels() {
		out[l] = true
	}
	if CheckDeclared(info) != nil {
		return out
	}
	for _, l := range info.DecisionLabels {
		out[l] = true
	}
	for _, l := range info.MarkReasons {
		out[l] = true
	}
	return out
}
