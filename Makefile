# hubsync — see README.md. Every target works on a fresh clone with only Go
# installed: the control-plane binaries the tests need are built from pinned
# Go modules on first use and cached outside the clone.

SHELL     := bash
GO        ?= go
# Every go command here, in every module of the repository, runs on this
# toolchain. A machine starts on its own Go, which ignores go.mod's go line
# under GOTOOLCHAIN=local; naming the version makes the go command fetch it
# from the module proxy the first time (about 76 MB).
GO_TOOLCHAIN ?= go1.27.3
export GOTOOLCHAIN := $(GO_TOOLCHAIN)
# On Go 1.27, golang.org/x/net's HTTP/2 client (v0.60 and later) wraps
# net/http's, which tells the tunnel pool of a GOAWAY only once the
# connection has closed; the http2legacy tag keeps x/net's own client, with
# the same fixes (tunnel/http2_wrapped.go). Every build and test has it,
# beside the GOFLAGS already set.
export GOFLAGS := $(strip $(filter-out -tags=http2legacy,$(shell GOTOOLCHAIN=$(GO_TOOLCHAIN) $(GO) env GOFLAGS)) -tags=http2legacy)
BIN       ?= bin
# A release's tag (vMAJOR.MINOR.PATCH, CHANGELOG.md); between
# releases, git describe's vX.Y.Z-N-gCOMMIT.
VERSION   ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v0.0.0-$$(git rev-parse --short HEAD 2>/dev/null || echo unknown))
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time, not the clock's: one commit builds one binary.
DATE      ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)
# Prints the directory holding kube-apiserver and etcd, building them first
# when the cache (~/.cache/hubsync by default) does not have this version.
ASSETS    := bash test/tools/build-kube-binaries.sh
# Prints the directory holding the konnectivity proxy-server and agent,
# building them first (~2 min) when the cache does not have them.
KONN      := bash test/tools/build-konnectivity.sh
# Prints the path of promtool, building it first (~5 min cold) when the
# cache does not have this version (test/tools/promtool pins it).
PROMTOOL  := bash test/tools/build-promtool.sh
# The vulnerability gate and dependency report (test/tools/vulncheck pins
# golang.org/x/vuln and golang.org/x/vulndb); its first run builds the
# offline database into the same cache (about 1 minute).
VULNCHECK := cd test/tools/vulncheck && $(GO) run .

.PHONY: all build release release-test generate crds helm-binaries schema dashboard manifests dashboard-check chart-test alerts-test fuzz vulncheck vulncheck-test deps-report test unit e2e argocd-proof multicluster-proof kueue-proof demo bench bench-rebuilds kube-binaries konnectivity-binaries fmt vet check clean

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

# Everything generated from the sources, to commit with them.
generate: schema dashboard manifests crds

# The ClusterProfile CRD the chart installs (charts/hubsync/crds/: Helm
# installs it when absent, never upgrades or deletes it; --skip-crds
# skips it), as the cluster-inventory-api version go.mod pins ships it.
crds:
	cp "$$($(GO) list -m -f '{{.Dir}}' sigs.k8s.io/cluster-inventory-api)/config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml" charts/hubsync/crds/
	chmod 644 charts/hubsync/crds/*.yaml

# The configuration's JSON Schema, derived from package config's types and
# doc comments, written into charts/hubsync/values.schema.json as
# properties.config (part of make generate; test/layout fails when it is
# stale).
schema:
	$(GO) run ./test/tools/configschema

# Fast tests of pure logic first, then end-to-end tests against a real
# kube-apiserver + etcd.
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /test/) ./test/layout/... ./test/testutil/...

# The Grafana dashboard (charts/hubsync/files/dashboard.json) is generated
# from Go with the Grafana Foundation SDK, in a module of its own
# (test/tools/dashboard); edit dashboard.go there, never the JSON.
dashboard:
	cd test/tools/dashboard && $(GO) run .


# The checked-in dashboard is what the generator writes, its queries parse
# with Prometheus's PromQL parser, and its panels and grid are what
# Grafana needs.
dashboard-check:
	cd test/tools/dashboard && $(GO) vet ./... && $(GO) test -count=1 ./...

e2e: kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) \
		$(GO) test -race -count=1 -p 1 -timeout 30m ./test/...

# Argo CD's own code reads the Secrets the argocd sink writes and reaches a
# real kube-apiserver through them, and sees a cluster once beside the
# argoproj-labs ClusterProfile integration (the scenarios: test/argocdproof).
# One module per release, as each pins other Kubernetes libraries: v3.2.0
# (test/argocd) and v3.6.1 (test/argocd-v3.6; the first run downloads Argo
# CD's dependencies and builds them, ~10 min on 2 busy cores).
argocd-proof: kube-binaries
	cd test/argocd && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -timeout 30m ./...
	cd test/argocd-v3.6 && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -timeout 30m ./...

# multicluster-runtime v0.23.1 engages the clusters of hubsync's profiles
# through a provider built on cluster-inventory-api's pkg/access (the
# upstream provider's module is not served) with `hubsync creds`, against a
# real hub and two real managed kube-apiservers; it counts the clusters'
# rebuilds and fails on any caused by a hubsync write that changes nothing
# a consumer reads. A module of its own.
multicluster-proof: kube-binaries
	cd test/multicluster && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -p 1 -timeout 20m ./...

# Kueue v0.19.2's own MultiKueue controllers run against a real hub beside
# the hubsync binary: the MultiKueueClusters the kueue sink writes (both
# sources) and the files the kubeconfig sink writes must be Active through
# a token rotation with revocation, and reach a real worker kube-apiserver.
# A module of its own (the first run downloads Kueue's dependencies).
kueue-proof: kube-binaries
	cd test/kueue && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -p 1 -timeout 20m ./...

# The alert rules the chart ships: promtool checks them and runs their unit
# tests (test/alerts), each alert firing with its labels and annotations
# and staying silent where it must.
alerts-test:
	@promtool=$$($(PROMTOOL)) && \
		$$promtool check rules --lint=all --lint-fatal charts/hubsync/files/alerts.yaml && \
		$$promtool test rules test/alerts/*_test.yaml

# The Helm chart (charts/hubsync) through Helm's own Go library (v3.22.0):
# lint --strict, renderings with a table of values, values.schema.json
# refusing bad values, every object decoded strictly into its Go type,
# deploy/ equal to what `make manifests` writes, and a server-side apply
# on a real kube-apiserver with hubsync run from the rendered
# configuration as the chart's ServiceAccount. A module of its own (Helm
# needs newer Kubernetes libraries).
chart-test: kube-binaries helm-binaries
	cd test/chart && $(GO) vet ./... && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) $(GO) test -count=1 -p 1 -timeout 30m ./...

# The helm CLI, v3 and v4, built from pinned modules (test/tools/helm3,
# test/tools/helm4) for the chart's lifecycle test; cached like the others.
helm-binaries:
	bash test/tools/build-helm.sh 3 >/dev/null
	bash test/tools/build-helm.sh 4 >/dev/null

# The vulnerability gate: govulncheck scans the shipped binary's packages
# (./cmd/hubsync) against the Go vulnerability database as the pinned
# golang.org/x/vulndb module holds it, offline, and fails on any
# vulnerable function they call that test/tools/vulncheck/allow.txt does
# not accept (each entry with an expiry date and a reason).
vulncheck:
	@$(VULNCHECK) check -C ../../.. -allow allow.txt ./cmd/hubsync

# The gate's own tests: it refuses a program that pins nats-server
# v2.12.1 and lets it through once the allow-list accepts each finding.
vulncheck-test:
	cd test/tools/vulncheck && $(GO) vet ./... && $(GO) test -count=1 ./...

# The release artefacts of this commit in $(DIST): binaries for linux and
# darwin on amd64 and arm64, each with its SBOM, the image as an OCI
# layout (built without a Docker daemon), the chart carrying the image's
# digest, and SHA256SUMS (test/tools/release).
DIST ?= dist/$(VERSION)
release:
	cd test/tools/release && $(GO) run . -root ../../.. -out $(abspath $(DIST)) -version $(VERSION) -commit $(COMMIT) -date $(DATE)

# A release of this checkout built twice and checked as its user would:
# checksums, versions, SBOMs, the chart and the image read from its OCI
# layout.
release-test:
	cd test/tools/release && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...

# Each direct dependency of hubsync beside the newest version the module
# proxy serves (where it lists them), with the vulnerabilities known in
# the version required, called or not.
deps-report:
	@$(VULNCHECK) deps -C ../../..

test: check unit fuzz vulncheck vulncheck-test release-test alerts-test dashboard-check chart-test e2e argocd-proof multicluster-proof kueue-proof

# The gateway's identity invariant (the cluster sees exactly the identity
# the gateway decided, or nothing) under fuzzed requests: raw HTTP/1.1,
# and HTTP/2 frame by frame (odd header blocks, CONTINUATION,
# RST_STREAM), each for FUZZ_TIME.
FUZZ_TIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzGatewayIdentity$$' -fuzztime $(FUZZ_TIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzGatewayIdentityHTTP2$$' -fuzztime $(FUZZ_TIME) ./gateway/

# deploy/ rendered from charts/hubsync with its default values (release
# hubsync in open-cluster-management-hub), without Helm's own labels.
manifests:
	cd test/chart && $(GO) run ./cmd/manifests

# The main job on an embedded default: a real API server, a simulated
# fleet, hubsync, and what it does as the fleet changes.
demo: build kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) $(GO) run ./test/demo --hubsync $(BIN)/hubsync $(DEMO_FLAGS)

# Performance figures, each as a ratio against a floor measured in the
# same run.
bench: build kube-binaries konnectivity-binaries
	KUBEBUILDER_ASSETS=$$($(ASSETS) 2>/dev/null) KONNECTIVITY_ASSETS=$$($(KONN) 2>/dev/null) $(GO) run ./test/bench --hubsync $(BIN)/hubsync $(BENCH_FLAGS)
	@if [ -z "$(BENCH_FLAGS)" ]; then $(MAKE) --no-print-directory bench-rebuilds; fi

# How often multicluster-runtime's ClusterProfile provider rebuilds a
# cluster while hubsync runs, by cause (part of the full `make bench`).
# The provider lives in its own module (test/multicluster), so the figure
# comes from its proof, run verbosely.
bench-rebuilds: kube-binaries
	@cd test/multicluster && set -o pipefail && KUBEBUILDER_ASSETS=$$(bash ../tools/build-kube-binaries.sh 2>/dev/null) \
		$(GO) test -count=1 -p 1 -timeout 20m -run TestMulticlusterRuntimeProof -v . | \
		sed -n 's/^ *[a-z_]*_test\.go:[0-9]*: /  /p'

clean:
	rm -rf $(BIN)
