# reaper build, test and tooling. Every binary lands in bin/ (ignored by git).
GO        ?= go
BIN       := bin
PKG       := github.com/dexaflow/reaper
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X $(PKG)/sdk.BuildVersion=$(VERSION)
PROTO_DIR := sdk/plugin/proto/reaperv1

BINARIES := \
	reaperd=./host/cmd/reaperd \
	reaperctl=./cmd/reaperctl \
	reaper-podlost=./plugins/podlost/cmd/reaper-podlost \
	reaper-dispatchlost=./plugins/dispatchlost/cmd/reaper-dispatchlost \
	reaper-agentlost=./plugins/agentlost/cmd/reaper-agentlost \
	reaper-warmworker=./plugins/warmworker/cmd/reaper-warmworker \
	reaper-orphanrun=./plugins/orphanrun/cmd/reaper-orphanrun \
	reaper-substrate-kube=./substrate/kube/cmd/reaper-substrate-kube \
	reaper-substrate-lite=./substrate/lite/cmd/reaper-substrate-lite \
	reaper-agent=./substrate/lite/cmd/reaper-agent

.PHONY: all build test lint proto clean demo e2e bench soak

all: build

build:
	@mkdir -p $(BIN)
	@for pair in $(BINARIES); do \
		name=$${pair%%=*}; pkg=$${pair#*=}; \
		echo "go build $$name"; \
		$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/$$name $$pkg || exit 1; \
	done

# The whole test suite: unit tests, real plugin binaries over go-plugin, and a
# real PostgreSQL started from the machine's own server binaries.
test:
	$(GO) test -count=1 -timeout 20m ./...

# The main job, end to end, in about a minute: a throwaway
# PostgreSQL (unless REAPER_DSN is set), reaperd with the Lite runner, a run
# of tasks as local processes, agents killed with kill -9, the reapers
# recovering them. Leaves nothing running and nothing behind.
demo: build
	@$(GO) build -o $(BIN)/reaper-demo ./demo
	@$(BIN)/reaper-demo

# The fault suite alone, verbose, ending with its figures table (make test
# runs it too).
e2e:
	$(GO) test -count=1 -v -timeout 15m ./test/e2e/

# The randomized fault soak of the Lite edition (not part of make test):
# PostgreSQL, three reaperd replicas, a stream of short tasks and random
# overlapping faults for SOAK (any Go duration), invariants judged while it
# runs and at the end, then a report. SEED=N replays a soak's choices.
SOAK ?= 10m
SEED ?=
soak: build
	REAPER_SOAK=$(SOAK) REAPER_SOAK_SEED=$(SEED) REAPER_SOAK_BIN=$(CURDIR)/$(BIN) \
		$(GO) test -count=1 -v -timeout 0 -run '^TestSoak$$' ./test/soak/

# Benchmarks of the board, the Lite substrate and the reapers.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./board/ ./substrate/lite/ ./test/reapers/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

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
