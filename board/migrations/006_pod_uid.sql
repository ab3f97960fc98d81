-- The UID of the pod the kube runner created for an attempt.
--
-- The kube runner records it once the pod create has answered, so an
-- operator (and a reaper or a test) can tell the attempt's own pod from a
-- pod of the same name made before or after it. Every rail that starts a
-- new execution clears it with the other per-attempt stamps.
ALTER TABLE task_instances ADD COLUMN pod_uid text;
