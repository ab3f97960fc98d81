-- The pod of every warm worker, as the kube runner created it.
--
-- A warm worker's pod spec carries its bootstrap credential, which anyone
-- allowed to read pods sees; the worker's exchange must prove it comes from
-- inside the pod the runner made (its projected ServiceAccount token names
-- the pod's UID). One row per worker, written once the create answered with
-- the pod's UID, and removed once it can no longer matter (see the kube
-- runner's record).
CREATE TABLE warm_worker_pods (
    worker      text PRIMARY KEY CHECK (worker <> ''),
    pod_uid     text NOT NULL CHECK (pod_uid <> ''),
    recorded_at timestamptz NOT NULL
);
CREATE INDEX warm_worker_pods_recorded_idx ON warm_worker_pods (recorded_at);
