# SPDX-License-Identifier: Apache-2.0
# The real-node suite (test/node): kubelet, containerd with NRI and runc built from Go
# modules, the test images built by build/imagebuilder, then test/node/node.sh and the
# Go tests in test/node. Included by the top-level Makefile.

NODE_BIN        := $(BIN)/node
NODE_OUT        := _output/node-test
RUNC_VERSION    := v1.5.3
CONTAINERD_VERSION := v2.4.2
# Snapshotters that need C headers or kernel features the suite does not use.
CONTAINERD_TAGS := no_btrfs no_devmapper no_zfs
# NODE_DIR holds the node's sockets: keep it short.
NODE_DIR        ?= /tmp/tessera-node-$(firstword $(shell printf '%s' '$(CURDIR)' | cksum))
NODE_TEST_RUN   ?= .
NODE_GO_TEST     = NODE_DIR=$(NODE_DIR) BIN_DIR=$(BIN) NODE_BIN_DIR=$(NODE_BIN) \
	IMAGES_TAR=$(CURDIR)/$(NODE_OUT)/images.tar HOOK_LIBRARY=$(CURDIR)/cuda-hook/build/libtessera-cuda.so \
	FAKE_DRIVER_DIR=$(CURDIR)/cuda-hook/build/plain/fake FAKE_MPS_CONTROL=$(CURDIR)/$(NODE_OUT)/bin/fake-mps-control \
	TESSERA_NODE_SUITE=1 $(GO) test -count=1 -timeout 30m -v -run '$(NODE_TEST_RUN)' ./test/node

# runc with seccomp (kubelet asks for the runtime's default profile): libseccomp's
# headers, from Debian's libseccomp-dev.
$(NODE_BIN)/runc:
	@[ -e /usr/include/seccomp.h ] || { echo "runc needs libseccomp's headers: apt-get install libseccomp-dev"; exit 1; }
	GOBIN=$(NODE_BIN) $(GO) install -tags seccomp -ldflags '-s -w' github.com/opencontainers/runc@$(RUNC_VERSION)

$(NODE_BIN)/containerd:
	GOBIN=$(NODE_BIN) $(GO) install -tags '$(CONTAINERD_TAGS)' -ldflags '-s -w' \
		github.com/containerd/containerd/v2/cmd/containerd@$(CONTAINERD_VERSION) \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$(CONTAINERD_VERSION) \
		github.com/containerd/containerd/v2/cmd/ctr@$(CONTAINERD_VERSION)

$(NODE_BIN)/kubelet: go.mod
	$(GO) build -ldflags "$(K8S_LDFLAGS) -s -w" -o $@ k8s.io/kubernetes/cmd/kubelet

.PHONY: node-binaries
node-binaries: $(NODE_BIN)/runc $(NODE_BIN)/containerd $(NODE_BIN)/kubelet ## Build runc, containerd 2.x (with ctr and the runc shim) and kubelet from Go modules into bin/node

# The suite's images: the CUDA probe (no driver: GPU containers get it through the
# agent's CDI spec), and the pod sandbox.
$(NODE_OUT)/bin/tessera-probe: test/node/probe/probe.c cuda-hook/include/tessera_cuda.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -Icuda-hook/include -o $@ $< -ldl

$(NODE_OUT)/bin/pause: test/node/probe/pause.c
	@mkdir -p $(@D)
	$(CC) -O2 -Wall -Werror -static -o $@ $<

$(NODE_OUT)/images.tar: $(NODE_OUT)/bin/tessera-probe $(NODE_OUT)/bin/pause test/node/images/*.yaml imagebuilder hook
	$(IMAGE_BUILDER) build -spec test/node/images/tessera-node-test.yaml -spec test/node/images/tessera-pause.yaml \
		-archs $(HOST_ARCH) -out $(NODE_OUT)/images -registry tessera.local -tag test \
		-source-date-epoch $(SOURCE_DATE_EPOCH) -apt-dir _output/apt $(if $(IMAGE_DEBS),-debs $(IMAGE_DEBS))
	tar -C $(NODE_OUT)/images/oci -cf $@ .

.PHONY: node-images
node-images: $(NODE_OUT)/images.tar ## Build the real-node suite's test images (CUDA probe, pod sandbox) as one OCI archive

# The fake driver's MPS control program, which the agent runs for the suite's MPS case
# on a node without a GPU.
$(NODE_OUT)/bin/fake-mps-control: test/node/fakemps/fake-mps-control.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -o $@ $<

# The node's fake NVIDIA driver (make test-node): node.sh installs it in NODE_DIR/driver.
.PHONY: node-fake-driver
node-fake-driver: $(NODE_OUT)/bin/fake-mps-control ## Build the fake NVIDIA driver (libcuda, libnvidia-ml of cuda-hook/fake, and the suite's fake MPS control program) that make test-node installs as its node's driver
	$(MAKE) --no-print-directory -C cuda-hook build/plain/fake/libcuda.so.1 build/plain/fake/libnvidia-ml.so.1

NODE_DEPS := node-binaries node-images node-fake-driver scheduler agent hook $(BIN)/etcd $(BIN)/kube-apiserver $(BIN)/kubectl

.PHONY: test-node
test-node: $(NODE_DEPS) ## Real-node suite without a GPU: kubelet, containerd+NRI, runc, the agent (NRI, then fallback) and pods on the fake driver (root)
	$(NODE_GO_TEST)

.PHONY: test-node-gpu
test-node-gpu: $(NODE_DEPS) ## Real-node suite on this machine's NVIDIA GPUs (root, driver, cgroup v2 or hybrid)
	TESSERA_NODE_GPU=1 $(NODE_GO_TEST)

# B6_PODS pods of each kind; GPU=1 measures on this machine's NVIDIA GPUs; B6_MODE=dra:
# the GPU pods ask through ResourceClaims on a node in DRA mode.
B6_PODS ?= 100
B6_MODE ?= nri
.PHONY: bench-node
bench-node: $(NODE_DEPS) ## B6: pod creation to first CUDA call on a real node, Tessera pods against the same pods without GPU requests (B6_PODS, GPU=1, B6_MODE=dra)
	TESSERA_NODE_B6=1 TESSERA_B6_PODS=$(B6_PODS) TESSERA_B6_MODE=$(B6_MODE) $(if $(filter 1,$(GPU)),TESSERA_NODE_GPU=1) \
		$(subst -run '$(NODE_TEST_RUN)',-run '^TestB6PodStart$$',$(NODE_GO_TEST))

.PHONY: node-gpu-bundle
node-gpu-bundle: ## Build the real-node suite for a GPU machine without Go into _output/node-gpu-bundle (test/node/gpu-bundle.sh run DIR there)
	test/node/gpu-bundle.sh build _output/node-gpu-bundle
