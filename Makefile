# hubsync — see README.md. Every target works on a fresh clone with only Go
# installed: the control-plane binaries the tests need are built from pinned
# Go modules on first use and cached outside the clone.

SHELL     := bash
GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# Prints the directory holding kube-apiserver and etcd, building them first
# when the cache (~/.cache/hubsync by default) does not have this version.
ASSETS    := bash test/tools/build-kube-binaries.sh
# Prints the directory holding the konnectivity proxy-server and agent,
# building them first (~2 min) when the cache does not have them.
KONN      := bash test/tools/build-konnectivity.sh

.PHONY: all build test unit e2e argocd-proof demo bench kube-binaries konnectivity-binaries fmt vet check clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/hubsync ./cmd/hubsync

kube-binaries:
	@$(ASSETS) >/dev/null

konnectivity-binaries:
	@$(KONN) >/dev/null

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

check: fmt vet

# Fast tests of pure logic first, then end-to-end tests against a real
# kube-apiserver + etcd.
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/) ./test/layout/...

e2e: kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) \
		$(GO) test -race -count=1 -p 1 -timeout 30m ./test/...

# Argo CD v3.2.0's own code reads the Secrets the argocd sink writes and
# reaches a real kube-apiserver through them. A module of its own: Argo CD
# pins older Kubernetes libraries (the first run downloads ~145 modules).
argocd-proof: kube-binaries
	cd test/argocd && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -timeout 30m ./...

test: check unit e2e argocd-proof

# The main job on an embedded default: a real API server, a simulated
# fleet, hubsync, and what it does as the fleet changes.
demo: build kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) $(GO) run ./test/demo --hubsync $(BIN)/hubsync $(DEMO_FLAGS)

# Performance figures, each as a ratio against a floor measured in the
# same run.
bench: build kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) $(GO) run ./test/bench --hubsync $(BIN)/hubsync $(BENCH_FLAGS)

clean:
	rm -rf $(BIN)
