# reaper build, test and tooling. Every binary lands in bin/ (ignored by git).
GO        ?= go
BIN       := bin
PKG       := github.com/dexaflow/reaper
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X $(PKG)/sdk.BuildVersion=$(VERSION)
PROTO_DIR := sdk/plugin/proto/reaperv1

BINARIES := \
	reaperd=./cmd/reaperd \
	reaperctl=./cmd/reaperctl \
	reaper-podlost=./plugins/podlost/cmd/reaper-podlost \
	reaper-dispatchlost=./plugins/dispatchlost/cmd/reaper-dispatchlost \
	reaper-agentlost=./plugins/agentlost/cmd/reaper-agentlost \
	reaper-warmworker=./plugins/warmworker/cmd/reaper-warmworker \
	reaper-orphanrun=./plugins/orphanrun/cmd/reaper-orphanrun \
	reaper-substrate-kube=./substrate/kube/cmd/reaper-substrate-kube \
	reaper-substrate-lite=./substrate/lite/cmd/reaper-substrate-lite \
	reaper-agent=./cmd/reaper-agent

.PHONY: all build test lint proto clean demo demo-kube demo-helm e2e bench image

all: build

build:
	@mkdir -p $(BIN)
	@for pair in $(BINARIES); do \
		name=$${pair%%=*}; pkg=$${pair#*=}; \
		echo "go build $$name"; \
		$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/$$name $$pkg || exit 1; \
	done

# The whole test suite: unit tests, real plugin binaries over go-plugin, and a
# real PostgreSQL started from the machine's own server binaries; then the
# example plugin's own module (examples/parked), on its own go.mod, and the
# container image's builder (tools/image), which builds and inspects it.
# The two fault suites (test/e2e, test/kubee2e) hold every scenario to a
# recovery deadline of a few seconds, so they run last, one after the other,
# on a machine no other test package is loading; then the install tier
# (test/install: the image and the Helm chart installed in a cluster that
# hosts them, on the real node).
FAULT_SUITES := ./test/e2e ./test/kubee2e ./test/install
test:
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v -x -e '.*/test/e2e' -e '.*/test/kubee2e' -e '.*/test/install')
	$(GO) test -count=1 -timeout 20m -p 1 $(FAULT_SUITES)
	cd examples/parked && GOWORK=off $(GO) test -count=1 ./...
	cd tools/image && GOWORK=off $(GO) test -count=1 -timeout 20m ./...

# The Kubernetes test cluster (etcd, kube-apiserver, kube-controller-manager,
# KWOK) and Helm for the chart's tests, built from source by the nested
# modules in tools/kubecluster and cached
# in the user's cache directory: about 18 minutes the first time on 2 cores,
# seconds after. make test builds it too when it is missing; kube-build shows
# the progress. kube-up starts one in the background and prints
# KUBECONFIG=<path>; kube-down stops it and removes what it made.
# make test runs the kube tests (testkit/kubetest and its users) on it.
# kube-build also builds the real node's binaries (tools/kubenode, a module
# and cache of its own: the kubelet, kube-scheduler, kube-proxy, CoreDNS and
# kube-router; about 8 minutes once the cluster's build is cached).
# kube-up NODE=real adds a real node (kubelet, containerd, runc) beside the
# KWOK nodes and what in-cluster workloads need: kube-scheduler placing the
# pods, kube-proxy (iptables mode) routing the Services' ClusterIPs, CoreDNS
# answering for cluster.local on the pod network's gateway, the API server
# on that gateway behind the kubernetes Service, and, where the machine has
# ipset, kube-router's NetworkPolicy controller (and nothing else of it)
# enforcing NetworkPolicies. It needs a machine that can host the node
# (root, containerd, runc, the CNI plugins, iptables, a static busybox and
# writable cgroups) and fails saying why on one that cannot. kube-down
# removes the node and everything it made (the iptables chains and ipsets
# included).
KUBECLUSTER := $(GO) run ./testkit/kubetest/cmd/kubecluster

.PHONY: kube-build kube-up kube-down

kube-build:
	@$(KUBECLUSTER) build

NODE ?= kwok
kube-up:
	@$(KUBECLUSTER) up -node $(NODE)

kube-down:
	@$(KUBECLUSTER) down

# The main job, end to end, in about a minute: a throwaway
# PostgreSQL (unless REAPER_DSN is set), reaperd with the Lite runner, a run
# of tasks as local processes, agents killed with kill -9, the reapers
# recovering them. Leaves nothing running and nothing behind.
demo: build
	@$(GO) build -o $(BIN)/reaper-demo ./demo
	@$(BIN)/reaper-demo

# The Kubernetes edition end to end, in about a minute once the control
# plane's binaries are cached (the first time it builds them from source,
# about 11 minutes, with progress): a local kube-apiserver, etcd, KWOK and
# kube-controller-manager, a throwaway PostgreSQL (unless REAPER_DSN), two
# reaperd replicas on a Kubernetes Lease with the kube runner; pods, a node,
# an eviction, an agent and the leading reaperd taken away under running
# runs. The pods run on a real node (kubelet, containerd, runc; the node
# lost waits out the controller manager's grace: about two minutes more)
# where the machine can host one, else on a kubelet player running each
# pod's agent as a local process; its first lines say which.
# NODE=kwok asks for the player, NODE=real for the real node or a failure.
# Leaves nothing running and nothing behind.
demo-kube: build
	@$(GO) build -o $(BIN)/reaper-demo ./demo
	@CGO_ENABLED=0 $(GO) build -o $(BIN)/reaper-agent-static ./cmd/reaper-agent
	@$(BIN)/reaper-demo -kube $(if $(filter command line environment,$(origin NODE)),-node $(NODE))

# The kube edition installed the way a user installs it, end to end, in
# about a minute and a half once the cluster's binaries and Go's build cache
# are warm (a cold image build adds a few minutes): the image built by
# tools/image and imported into the test cluster's real node, a local
# cluster that hosts in-cluster workloads (as make kube-up NODE=real starts
# it), PostgreSQL on the pod network's gateway, the three Secrets, reaperd
# migrate, helm install of deploy/helm/reaper with a values file (printed,
# with each command as a user types it), both replicas Ready, a run
# submitted with reaperctl, the leading replica's pod and a task pod
# deleted under it, the task pods and their Events, then helm uninstall.
# The walk of docs/operate.md, "Install on a cluster, step by step"; the
# install tier (test/install) holds it to its promises in make test. Needs
# a machine that can host the real node (it fails saying why on one that
# cannot). Leaves nothing running and nothing behind.
demo-helm: build
	@$(GO) build -o $(BIN)/reaper-demo ./demo
	@$(BIN)/reaper-demo -helm -version $(VERSION)

# The fault suite alone, verbose, ending with its figures table (make test
# runs it too).
e2e:
	$(GO) test -count=1 -v -timeout 15m ./test/e2e/

# The kube edition's fault suite alone, verbose, ending with its figures
# table (make test runs it too): a local API server, etcd, KWOK and the
# controller manager, PostgreSQL, two reaperd per scenario on the Lease.
.PHONY: e2e-kube
e2e-kube:
	$(GO) test -count=1 -v -timeout 15m -run TestKubeFaultSuite ./test/kubee2e/

# The randomized fault soak (not part of make test): PostgreSQL, three
# reaperd replicas, a stream of short tasks and random overlapping faults for
# SOAK (any Go duration), invariants judged while it runs and at the end,
# then a report. SEED=N replays a soak's choices. EDITION=lite (default) runs
# the Lite runner and local agents, with the PostgreSQL nemeses drawn too (a
# replica partitioned from the database, the database frozen, the primary
# killed and its standby promoted: synchronous, or made asynchronous and
# left behind so that the last writes and a term increment are lost);
# EDITION=kube runs the kube runner on a
# local kube-apiserver + KWOK (+ kube-controller-manager) with the kubelet
# player running the agents, leader "kubernetes", and the kube faults (pod
# deleted, node lost, eviction, API server paused), Lite's database nemeses
# (a replica partitioned from PostgreSQL, the primary frozen, a failover to
# the standby, synchronous or asynchronous and behind) and a replica
# partitioned from the API server.
# EDITION=kube NODE=real (NODE as kube-up takes it; kwok, the default, is
# the player) runs the pods on the test cluster's real node instead (a real
# kubelet, containerd and runc; root, one real node per machine: a start
# waits for the machine's node while another cluster holds it), with the
# kubelet's faults (killed -9 and restarted, frozen) in place of the node
# loss, and the wedged agent and a teardown refused past the valve (a
# webhook refusing the pod's update and delete, its agent frozen) added.
# A run takes SOAK plus about a minute (start, recovery,
# report); the kube edition's first run builds the cluster's binaries when
# they are not cached (make kube-build).
SOAK    ?= 10m
SEED    ?=
EDITION ?= lite
.PHONY: soak
soak: build
	REAPER_SOAK=$(SOAK) REAPER_SOAK_SEED=$(SEED) REAPER_SOAK_EDITION=$(EDITION) REAPER_SOAK_NODE=$(NODE) \
		REAPER_SOAK_BIN=$(CURDIR)/$(BIN) \
		$(GO) test -count=1 -v -timeout 0 -run '^TestSoak$$' ./test/soak/

# Benchmarks of the board, the Lite substrate and the reapers (the mass
# recovery over 10,000 and 100,000 dead attempts, audit rows written), and
# the kube edition's over 10,000 pods on the test cluster (test/kubereapers:
# the steady-state pass beside the Lite one, the mass pod loss).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x -timeout 60m ./board/ ./substrate/lite/ ./test/reapers/ ./runner/attemptapi/ \
		./test/kubereapers/

# The peer benchmark (not part of make test): River's JobRescuer, the
# reaper's agentlost mass recovery (in and out of process) and plain-SQL
# baselines over N stuck rows on one throwaway PostgreSQL, one table of rows/s
# and ratios. A module of its own (tools/peerbench): River never enters the
# product's go.mod. PEERS_N is a comma-separated list of sizes, PEERS_RUNS
# the interleaved runs per size.
PEERS_N    ?= 10000,100000
PEERS_RUNS ?= 3
.PHONY: bench-peers
bench-peers: build
	cd tools/peerbench && GOWORK=off $(GO) run . -bin $(CURDIR)/$(BIN) -n $(PEERS_N) -runs $(PEERS_RUNS)

# The fleet-scale benchmarks (not part of make test; under 30 minutes on
# 2 cores): heartbeats a second through the attempt API, reap passes over
# 10,000 / 50,000 / 150,000 running attempts of each edition, podlost's full
# walk alone at 50,000 / 150,000, the informer's bytes per pod, the audit's explain and prune at 10,000,000 decisions; one
# table at the end, progress lines while it runs.
.PHONY: bench-scale
bench-scale: build
	REAPER_SCALE_BIN=$(CURDIR)/$(BIN) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 40m ./test/scale/

# The container image, built offline (no daemon, no base image): an OCI
# layout in bin/image/oci and bin/image/reaper.tar for docker/podman load.
image:
	cd tools/image && GOWORK=off $(GO) run . -root ../.. -out ../../$(BIN)/image -version $(VERSION) \
		-created $$(git log -1 --format=%ct 2>/dev/null || echo 0)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd examples/parked && GOWORK=off $(GO) vet ./...
	cd tools/image && GOWORK=off $(GO) vet ./...
	cd tools/peerbench && GOWORK=off $(GO) vet ./...

# Regenerates the protocol's Go code. Needs protoc (Debian: protobuf-compiler);
# the Go generators are pinned as tool lines in go.mod.
proto:
	protoc -I $(PROTO_DIR) -I /usr/include \
		--plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=paths=source_relative:$(PROTO_DIR) \
		--go-grpc_out=paths=source_relative:$(PROTO_DIR) \
		$(PROTO_DIR)/reaper.proto

clean:
	rm -rf $(BIN)
