# SPDX-License-Identifier: Apache-2.0
# Tessera: GPU sharing for Kubernetes. `make help` lists the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

K8S_VERSION := 1.37.2
BIN         := $(CURDIR)/bin
GO          ?= go
# go-nvml's bundled header marks many calls deprecated; the warnings are noise here.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
K8S_LDFLAGS := -X k8s.io/component-base/version.gitVersion=v$(K8S_VERSION) \
               -X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION))) \
               -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION)))
# The older Kubernetes minors the scheduler is also built for, each with a build module
# build/k8s-minors/<minor> that pins that release (hack/update-k8s-minor.sh) and the
# build tag k8s<minor> for the plugin files that differ (build/k8s-minors/README.md).
K8S_MINORS  := 1.34.4 1.35.4 1.36.3
k8s_minor    = $(word 1,$(subst ., ,$(1))).$(word 2,$(subst ., ,$(1)))
k8s_ldflags  = -X k8s.io/component-base/version.gitVersion=v$(1) \
               -X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(1))) \
               -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(1)))
MINORS      := $(foreach v,$(K8S_MINORS),$(call k8s_minor,$(v)))
# The release of a minor of K8S_MINORS: $(call minor_version,1.34) is 1.34.4.
minor_version = $(filter $(1).%,$(K8S_MINORS))
# make test-integration K8S_MINOR=1.34: the suite built in that minor's module, so the
# in-process kube-apiserver (and the scheduler) are that minor's.
K8S_MINOR   ?= $(call k8s_minor,$(K8S_VERSION))
GIT_REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
AGENT_LDFLAGS  = -X main.version=$(IMAGE_TAG) -X main.revision=$(GIT_REVISION)

# Packages whose tests need nothing but Go (and cgo): everything except the suites
# that start an API server or a whole local cluster.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v -e /test/integration -e /test/e2e -e /test/node)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-19s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Build

.PHONY: build
build: scheduler agent hook ## Build the scheduler, the node agent and the CUDA hook

.PHONY: scheduler
scheduler: ## Build bin/tessera-scheduler (kube-scheduler + Tessera plugins)
	$(GO) build -ldflags "$(K8S_LDFLAGS)" -o $(BIN)/tessera-scheduler ./cmd/tessera-scheduler

.PHONY: agent
agent: ## Build bin/tessera-node-agent
	$(GO) build -ldflags "$(AGENT_LDFLAGS)" -o $(BIN)/tessera-node-agent ./cmd/tessera-node-agent

# One scheduler per older minor, in bin/k8s-<minor>/ (about 3 min each from a cold
# build cache on 2 cores, seconds when only plugin code changed: build/k8s-minors/README.md).
.PHONY: build-minors $(foreach m,$(MINORS),scheduler-$(m))
build-minors: $(foreach m,$(MINORS),scheduler-$(m)) ## Build bin/k8s-<minor>/tessera-scheduler for each older Kubernetes minor (K8S_MINORS)

$(foreach m,$(MINORS),scheduler-$(m)): scheduler-%:
	cd build/k8s-minors/$* && $(GO) build -tags k8s$* -ldflags "$(call k8s_ldflags,$(call minor_version,$*))" \
		-o $(or $(SCHEDULER_OUT),$(BIN)/k8s-$*/tessera-scheduler) github.com/tessera-dev/tessera/cmd/tessera-scheduler

# kube-apiserver of an older minor, from its build module (make kube-apiserver-1.34).
$(foreach m,$(MINORS),$(BIN)/k8s-$(m)/kube-apiserver): $(BIN)/k8s-%/kube-apiserver: build/k8s-minors/%/go.mod
	cd build/k8s-minors/$* && $(GO) build -ldflags "$(call k8s_ldflags,$(call minor_version,$*))" -o $@ k8s.io/kubernetes/cmd/kube-apiserver

.PHONY: $(foreach m,$(MINORS),kube-apiserver-$(m))
$(foreach m,$(MINORS),kube-apiserver-$(m)): kube-apiserver-%: $(BIN)/k8s-%/kube-apiserver

.PHONY: hook
hook: ## Build the CUDA hook library (cuda-hook/build/)
	$(MAKE) -C cuda-hook all

# Control-plane binaries built from Go modules (nothing is downloaded from release pages).
$(BIN)/etcd: go.mod
	$(GO) build -o $@ go.etcd.io/etcd/server/v3

$(BIN)/kube-apiserver: go.mod
	$(GO) build -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(BIN)/kwok: go.mod
	$(GO) build -o $@ sigs.k8s.io/kwok/cmd/kwok

# kubectl reports its own version through client-go's version package as well.
$(BIN)/kubectl: go.mod
	$(GO) build -ldflags "$(K8S_LDFLAGS) $(subst k8s.io/component-base/version,k8s.io/client-go/pkg/version,$(K8S_LDFLAGS))" -o $@ k8s.io/kubernetes/cmd/kubectl

.PHONY: control-plane
control-plane: $(BIN)/etcd $(BIN)/kube-apiserver $(BIN)/kwok $(BIN)/kubectl ## Build etcd, kube-apiserver, kwok and kubectl (of the pinned Kubernetes) for the local cluster

##@ Run

.PHONY: run
run: ## Start a local cluster with simulated GPU nodes, schedule a sample workload, print the allocation
	@hack/local-up.sh $(RUN_FLAGS)

.PHONY: stop
stop: ## Stop the local cluster started by make run
	@hack/local-down.sh

.PHONY: kubectl-tessera
kubectl-tessera: ## Build the kubectl plugin bin/kubectl-tessera (allocation, wait, completion) and its completion helper
	$(GO) build -o $(BIN)/kubectl-tessera ./cmd/kubectl-tessera
	install -m 0755 cmd/kubectl-tessera/kubectl_complete-tessera $(BIN)/kubectl_complete-tessera

##@ Test

.PHONY: test
test: test-unit test-hook test-integration test-kueue test-e2e test-security test-minors ## Run every test that needs no GPU (what CI runs): the newest minor fully, the older minors built and the integration suite on the oldest, Kueue against the chart's quota policies

.PHONY: test-unit
test-unit: ## Unit tests of all Go packages
	$(GO) test -count=1 -timeout 15m $(UNIT_PKGS)

.PHONY: test-hook
test-hook: ## CUDA hook tests against the fake driver, plain and under ASan/UBSan, and from a 150+ character path
	$(MAKE) -C cuda-hook test
	hack/test-long-path.sh

.PHONY: test-integration
test-integration: $(BIN)/etcd ## The real scheduler against an in-process kube-apiserver and etcd (K8S_MINOR=1.34: both of that minor)
ifeq ($(K8S_MINOR),$(call k8s_minor,$(K8S_VERSION)))
	PATH=$(BIN):$$PATH $(GO) test -count=1 -timeout 30m ./test/integration/...
else
	@[ -n "$(call minor_version,$(K8S_MINOR))" ] || { echo "K8S_MINOR=$(K8S_MINOR): not one of $(MINORS) $(call k8s_minor,$(K8S_VERSION))"; exit 1; }
	cd build/k8s-minors/$(K8S_MINOR) && PATH=$(BIN):$$PATH $(GO) test -tags k8s$(K8S_MINOR) -count=1 -timeout 30m \
		github.com/tessera-dev/tessera/test/integration/...
endif

# test/kueue is a module of its own: Kueue pins other Kubernetes libraries than
# Tessera. envtest runs the pinned etcd and kube-apiserver from $(BIN).
.PHONY: test-kueue
test-kueue: $(BIN)/etcd $(BIN)/kube-apiserver ## Kueue's controllers admit and queue GPU Jobs by the chart's quota resources (docs/quotas.md), against the pinned kube-apiserver
	cd test/kueue && KUBEBUILDER_ASSETS=$(BIN) $(GO) test -count=1 -timeout 20m ./...

# Not part of test: each older minor's build costs minutes from a cold build cache
# (build/k8s-minors/README.md).
.PHONY: test-minors
test-minors: build-minors ## Build each older minor's scheduler, then the integration suite against the oldest minor's API server
	$(MAKE) --no-print-directory test-integration K8S_MINOR=$(firstword $(MINORS))

.PHONY: test-e2e
test-e2e: ## The whole stack: control plane, scheduler, node agents and kwok, started by hack/local-up.sh
	$(MAKE) --no-print-directory scheduler agent kubectl-tessera control-plane
	BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 20m ./test/e2e/...

.PHONY: test-security
test-security: ## The attack suite (test/security/attacks.txt): every listed attack has a test, and each passes because the attack fails
	test/security/run.sh

.PHONY: test-security-gpu
test-security-gpu: ## The attack suite's real-GPU entries (a machine with an NVIDIA GPU, root, nvcc, PyTorch)
	test/security/run.sh --gpu

.PHONY: test-gpu
test-gpu: ## Real-GPU suites (run on a machine with an NVIDIA GPU)
	$(MAKE) -C cuda-hook test-gpu
	$(GO) test -count=1 -tags gpu ./node-agent/...

.PHONY: test-gpu-2
test-gpu-2: ## Node agent on real GPUs: NVML inventory and links, containers run with runc through the real NRI plugin (the two-GPU checks need two)
	node-agent/gpu/run-two-gpu.sh build $(BIN)/gpu2
	node-agent/gpu/run-two-gpu.sh run $(BIN)/gpu2

# FUZZTIME is per target; CI passes a few seconds.
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 10s

.PHONY: fuzz
fuzz: ## Run every fuzz target (decoders, cgroup paths, scheduler args, C vs Go limits, share and agent-reply readers) for FUZZTIME each
	GO=$(GO) hack/fuzz.sh $(FUZZTIME) $(FUZZMINIMIZETIME)

##@ Benchmarks

# B1 at reduced size replays seed 42 with the validating baseline (BestFit) and the
# production profiles; FULL=1 replays seeds 42-51 with every policy (about an hour on
# two cores).
B1_SEEDS    = $(if $(FULL),42-51,42)
B1_POLICIES = $(if $(filter dra,$(B1_MODE)),$(if $(FULL),binpack$(comma)spread$(comma)fragmentation$(comma)first-fit,binpack$(comma)fragmentation$(comma)first-fit),$(if $(FULL),random$(comma)bestfit$(comma)binpack$(comma)spread$(comma)fragmentation$(comma)fragmentation-gpuscore,bestfit$(comma)binpack$(comma)fragmentation))
# B1_WORKLOAD: a workload variety of the FGD paper (gpuspec33, multigpu50, gpushare40,
# cpu250, ...; docs/simulator.md); results then go to _output/b1-$(B1_WORKLOAD).
B1_WORKLOAD = default
B1_MODE     = device-plugin
B1_OUT      = _output/b1$(if $(filter-out default,$(B1_WORKLOAD)),-$(B1_WORKLOAD))$(if $(filter dra,$(B1_MODE)),-dra)
comma := ,

# B2 at reduced size schedules 2,000 pods per phase on 500 nodes x 8 GPUs (a few
# minutes on two cores); FULL=1 is benchmark B2's size (docs/benchmarks.md), 10,000 pods on 5,000 nodes.
B2_NODES = $(if $(FULL),5000,500)
B2_PODS  = $(if $(FULL),10000,2000)
B2_ROUNDS ?= 3
# B2_PROFILE: the Tessera profile of config/scheduler/tessera-scheduler.yaml measured
# against the default one (tessera-fragmentation, the first and default profile; e.g.
# tessera-binpack).
B2_PROFILE ?= tessera-fragmentation

.PHONY: bench
bench: ## Scheduler benchmarks: Filter+Score per node, cache memory, then B1 and B2 (FULL=1 for full size); the hook's B3 CPU microbenchmark
	$(GO) test -run XXX -bench . -benchmem -benchtime 2s ./plugins/...
	$(MAKE) --no-print-directory bench-b1
	$(MAKE) --no-print-directory bench-b2
	$(MAKE) --no-print-directory bench-hook

.PHONY: bench-hook
bench-hook: ## B3 CPU microbenchmark: ns per launch and per alloc/free with and without the CUDA hook, fake driver; results in cuda-hook/build/bench
	$(MAKE) -C cuda-hook bench

.PHONY: bench-b1
bench-b1: ## B1 placement quality: replay the openb trace (FULL=1: 10 seeds, every policy; B1_WORKLOAD=gpuspec33 etc.: a variety; B1_MODE=dra: ResourceClaims); results in _output/b1[-variety][-dra]
	$(GO) build -o $(BIN)/tessera-sim ./cmd/tessera-sim
	$(BIN)/tessera-sim -mode $(B1_MODE) -seeds $(B1_SEEDS) -policies $(B1_POLICIES) -workload $(B1_WORKLOAD) -out $(B1_OUT)

# The whole go test -v log goes to _output/b2/last-run.log; the progress of each phase
# (nodes and pods created, pods bound) reaches the terminal while it runs: bars drawn
# on /dev/tty when stderr is a terminal, else the test's plain progress lines, picked
# out of the log as it is written.
.PHONY: bench-b2
bench-b2: $(BIN)/etcd ## B2 scheduling throughput: Tessera vs the default profile against a real API server, with progress; results in _output/b2
	mkdir -p _output/b2
	set -o pipefail; \
	TESSERA_B2=1 TESSERA_B2_NODES=$(B2_NODES) TESSERA_B2_PODS=$(B2_PODS) TESSERA_B2_ROUNDS=$(B2_ROUNDS) TESSERA_B2_PROFILE=$(B2_PROFILE) \
		TESSERA_B2_PROGRESS=$$([ -t 2 ] && echo /dev/tty) PATH=$(BIN):$$PATH \
		$(GO) test -count=1 -timeout 60m -run '^TestB2SchedulingThroughput$$' -v ./test/integration 2>&1 \
		| tee _output/b2/last-run.log | { grep --line-buffered '^progress: ' >&2 || true; } \
		|| { tail -50 _output/b2/last-run.log; exit 1; }
	cat _output/b2/b2-$(B2_NODES)n-$(B2_PODS)p.md

# B2 for ResourceClaims: claim pods placed by the in-tree DynamicResources alone (first
# fit) against tessera-binpack's TesseraDynamicResources, same claims, two pools of
# B2_CLAIM_NODES nodes of eight H100s.
B2_CLAIM_NODES ?= 100
B2_CLAIM_PODS  ?= 1000

.PHONY: bench-b2-claims
bench-b2-claims: $(BIN)/etcd ## B2 for ResourceClaims: TesseraDynamicResources vs DynamicResources alone against a real API server; results in _output/b2/claims.txt
	mkdir -p _output/b2
	set -o pipefail; \
	TESSERA_B2=1 TESSERA_B2_CLAIMS=1 TESSERA_B2_CLAIM_NODES=$(B2_CLAIM_NODES) TESSERA_B2_CLAIM_PODS=$(B2_CLAIM_PODS) \
		TESSERA_B2_PROGRESS=$$([ -t 2 ] && echo /dev/tty) PATH=$(BIN):$$PATH \
		$(GO) test -count=1 -timeout 60m -run '^TestB2Claims$$' -v ./test/integration 2>&1 \
		| tee _output/b2/claims-last-run.log | { grep --line-buffered '^progress: ' >&2 || true; } \
		|| { tail -50 _output/b2/claims-last-run.log; exit 1; }
	cat _output/b2/claims.txt

.PHONY: bench-gpu
bench-gpu: ## CUDA hook benchmarks on a real GPU (B3-B5)
	$(MAKE) -C cuda-hook bench-gpu

.PHONY: bench-b7
bench-b7: ## B7 co-located throughput on a real GPU: no limits, hook pacing, MPS (root)
	$(MAKE) -C cuda-hook
	cuda-hook/gpu/run-b7.sh cuda-hook/build

##@ Verify

.PHONY: lint
lint: ## go vet and gofmt
	$(GO) vet ./...
	hack/verify-gofmt.sh

.PHONY: verify
verify: lint ## lint, plus module, Kubernetes-pin (the repository's and each older minor's), licence-line, rendered-manifest, chart-README and Markdown table and link checks
	hack/spdx.sh
	hack/verify-k8s-version.sh $(K8S_VERSION)
	hack/verify-k8s-minors.sh $(K8S_MINORS)
	$(GO) mod verify
	hack/verify-manifests.sh
	$(GO) run ./hack/chart-readme -verify
	$(GO) run ./hack/docs-check

.PHONY: clean
clean: ## Remove build outputs
	rm -rf $(BIN)
	$(MAKE) -C cuda-hook clean

##@ Deploy

# Images are tagged with the chart's appVersion unless IMAGE_TAG says otherwise, so the
# chart's default image references match what make images builds.
REGISTRY       ?= ghcr.io/tessera-dev
IMAGE_TAG      ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' config/deploy/tessera/Chart.yaml)
# build/imagebuilder assembles the images defined by build/<image>.yaml from what the
# targets above build, for each of PLATFORMS, into one OCI image layout with an SBOM
# per image; no container engine is involved (docs/install.md).
IMAGES         := tessera-scheduler tessera-node-agent
PLATFORMS      ?= linux/amd64 linux/arm64
IMAGE_ARCHS     = $(patsubst linux/%,%,$(PLATFORMS))
IMAGES_DIR     := _output/images
IMAGE_LAYOUT   := $(IMAGES_DIR)/oci
IMAGE_BUILDER  := $(BIN)/imagebuilder
# Every timestamp in the images is the last commit's time: rebuilding a commit gives the
# same image digests.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# The images' binaries carry no build-machine paths; the scheduler is static (no cgo)
# for its empty base. IMAGE_DEBS: a directory of .debs fetched before (offline build).
IMAGE_GOFLAGS  := -trimpath -buildvcs=false
IMAGE_DEBS     ?=
# The C compiler of each architecture, for the agent (cgo) and the hook: the machine's
# gcc for its own, Debian's cross compilers otherwise.
HOST_ARCH      := $(shell $(GO) env GOARCH)
CC_amd64       ?= $(if $(filter amd64,$(HOST_ARCH)),gcc,x86_64-linux-gnu-gcc)
CC_arm64       ?= $(if $(filter arm64,$(HOST_ARCH)),gcc,aarch64-linux-gnu-gcc)
CROSS_DEBS_amd64 := gcc-x86-64-linux-gnu libc6-dev-amd64-cross
CROSS_DEBS_arm64 := gcc-aarch64-linux-gnu libc6-dev-arm64-cross
comma_archs     = $(subst $(space),$(comma),$(strip $(IMAGE_ARCHS)))
space          := $(empty) $(empty)

define build-images
	$(IMAGE_BUILDER) build $(foreach i,$(IMAGES),-spec build/$(i).yaml) -archs $(comma_archs) -out $(1) \
		-registry $(REGISTRY) -tag $(IMAGE_TAG) -revision $(GIT_REVISION) -source-date-epoch $(SOURCE_DATE_EPOCH) \
		-apt-dir _output/apt $(if $(IMAGE_DEBS),-debs $(IMAGE_DEBS))
endef

.PHONY: imagebuilder
imagebuilder: ## Build bin/imagebuilder, which builds, checks and pushes the images and the chart
	$(GO) build -o $(IMAGE_BUILDER) ./build/imagebuilder

# Debian's cross compilers for the PLATFORMS other than this machine's, installed with
# apt-get where missing (as root, like .ci/run's gcc).
.PHONY: image-toolchains
image-toolchains:
	@need=""; for a in $(IMAGE_ARCHS); do \
		case $$a in amd64) cc='$(CC_amd64)'; debs='$(CROSS_DEBS_amd64)';; arm64) cc='$(CC_arm64)'; debs='$(CROSS_DEBS_arm64)';; \
			*) echo "PLATFORMS: linux/$$a is not supported (linux/amd64, linux/arm64)"; exit 1;; esac; \
		command -v $$cc >/dev/null 2>&1 || need="$$need $$debs"; \
	done; \
	if [ -n "$$need" ]; then \
		echo "installing$$need"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$need; \
	fi

# The three files of each architecture's images, in _output/images/bin/linux_<arch>/.
image-bin-%: image-toolchains
	CGO_ENABLED=0 GOARCH=$* GOFLAGS="$(IMAGE_GOFLAGS)" $(MAKE) --no-print-directory scheduler BIN=$(CURDIR)/$(IMAGES_DIR)/bin/linux_$*
	CGO_ENABLED=1 GOARCH=$* CC=$(CC_$*) GOFLAGS="$(IMAGE_GOFLAGS)" $(MAKE) --no-print-directory agent BIN=$(CURDIR)/$(IMAGES_DIR)/bin/linux_$*
	$(MAKE) --no-print-directory -C cuda-hook all CC=$(CC_$*) BUILD=$(CURDIR)/$(IMAGES_DIR)/bin/linux_$*

.PHONY: images
images: $(foreach a,$(IMAGE_ARCHS),image-bin-$(a)) imagebuilder ## Build both images for PLATFORMS into the OCI layout _output/images/oci, with SPDX SBOMs (REGISTRY, IMAGE_TAG); no container engine needed
	$(call build-images,$(IMAGES_DIR))

# The scheduler image of an older minor, tagged as the chart runs it on that minor
# ($(IMAGE_TAG)-k8s<minor>), in a layout of its own: the same spec, its binary built in
# the minor's module under a root of its own (imagebuilder's -root).
MINOR_IMAGES_DIR = $(IMAGES_DIR)/k8s-$(K8S_MINOR)

.PHONY: images-minor
images-minor: imagebuilder ## The scheduler image of K8S_MINOR (an older minor) for PLATFORMS, tagged IMAGE_TAG-k8s<minor>, in _output/images/k8s-<minor>/oci
	@[ -n "$(call minor_version,$(K8S_MINOR))" ] || { echo "K8S_MINOR=$(K8S_MINOR): not one of $(MINORS)"; exit 1; }
	for a in $(IMAGE_ARCHS); do \
		CGO_ENABLED=0 GOARCH=$$a GOFLAGS="$(IMAGE_GOFLAGS)" $(MAKE) --no-print-directory scheduler-$(K8S_MINOR) \
			SCHEDULER_OUT=$(CURDIR)/$(MINOR_IMAGES_DIR)/root/$(IMAGES_DIR)/bin/linux_$$a/tessera-scheduler || exit 1; \
	done
	$(IMAGE_BUILDER) build -spec build/tessera-scheduler.yaml -root $(MINOR_IMAGES_DIR)/root -archs $(comma_archs) \
		-out $(MINOR_IMAGES_DIR) -registry $(REGISTRY) -tag $(IMAGE_TAG)-k8s$(K8S_MINOR) -revision $(GIT_REVISION) \
		-source-date-epoch $(SOURCE_DATE_EPOCH) -apt-dir _output/apt

.PHONY: push-images-minor
push-images-minor: images-minor ## Push the scheduler image of K8S_MINOR to REGISTRY as IMAGE_TAG-k8s<minor> (INSECURE=1: plain HTTP)
	$(IMAGE_BUILDER) push -layout $(MINOR_IMAGES_DIR)/oci -image tessera-scheduler \
		-to $(REGISTRY)/tessera-scheduler:$(IMAGE_TAG)-k8s$(K8S_MINOR) $(if $(INSECURE),-insecure)

.PHONY: push-images
push-images: images ## Push both images (an index of PLATFORMS each) and their SBOMs to REGISTRY as IMAGE_TAG, with docker login's credentials (INSECURE=1: plain HTTP)
	for i in $(IMAGES); do \
		$(IMAGE_BUILDER) push -layout $(IMAGE_LAYOUT) -image $$i -to $(REGISTRY)/$$i:$(IMAGE_TAG) $(if $(INSECURE),-insecure) || exit 1; \
	done

.PHONY: push-chart
push-chart: imagebuilder ## Package the Helm chart and push it to oci://REGISTRY/tessera (helm pull oci://...), with docker login's credentials (INSECURE=1)
	$(IMAGE_BUILDER) push-chart -chart config/deploy/tessera -to $(REGISTRY) -out _output/charts \
		-source-date-epoch $(SOURCE_DATE_EPOCH) $(if $(INSECURE),-insecure)

.PHONY: test-images
test-images: images ## Check every platform's images and SBOMs, run this machine's binaries (chroot), and rebuild to compare digests
	$(IMAGE_BUILDER) check -layout $(IMAGE_LAYOUT) -archs $(comma_archs)
	TESSERA_IMAGES_DIR=$(CURDIR)/$(IMAGES_DIR) TESSERA_IMAGES_ARCHS=$(comma_archs) $(GO) test -count=1 -run '^TestBuiltImages$$' ./build/imagebuilder
	$(IMAGE_BUILDER) run -skip-without-chroot -layout $(IMAGE_LAYOUT) -image tessera-scheduler -- /usr/local/bin/tessera-scheduler --version
	$(IMAGE_BUILDER) run -skip-without-chroot -layout $(IMAGE_LAYOUT) -image tessera-node-agent -- /usr/local/bin/tessera-node-agent --version
	$(IMAGE_BUILDER) run -skip-without-chroot -layout $(IMAGE_LAYOUT) -image tessera-node-agent -- /usr/local/bin/tessera-node-agent install-hook --to /tmp
	rm -rf $(IMAGES_DIR)/rebuild
	$(call build-images,$(IMAGES_DIR)/rebuild)
	diff -r $(IMAGE_LAYOUT) $(IMAGES_DIR)/rebuild/oci
	@echo "images reproducible: $$(cat $(IMAGES_DIR)/*.digest | tr '\n' ' ')"

.PHONY: manifests
manifests: ## Render the Helm chart to the plain manifests in config/deploy/manifests
	hack/render-manifests.sh

.PHONY: verify-manifests
verify-manifests: ## Check that config/deploy/manifests is what the chart renders
	hack/verify-manifests.sh

.PHONY: chart-readme
chart-readme: ## Write the values table of config/deploy/tessera/README.md from values.yaml's comments and values.schema.json
	$(GO) run ./hack/chart-readme

.PHONY: verify-chart-readme
verify-chart-readme: ## Check that the chart README's values table matches values.yaml
	$(GO) run ./hack/chart-readme -verify

# The real-node suite: make test-node, make test-node-gpu (test/node/README.md).
include test/node/node.mk
