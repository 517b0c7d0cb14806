#!/usr/bin/env bash
# Build kube-apiserver, etcd and kubectl for the end-to-end tests using ONLY
# the Go module proxy (no GitHub, no dl.k8s.io / storage.googleapis.com, no
# Docker).
#
# Versions come from the committed wrapper modules tools/kube-apiserver,
# tools/etcd and tools/kubectl (regenerate them with gen-tool-wrappers.sh).
#
# Output: a directory usable as KUBEBUILDER_ASSETS, printed on stdout:
#   $BIN_ROOT/k8s-<k8s>-etcd-<etcd>-<goos>-<goarch>/{kube-apiserver,etcd,kubectl}
# A .stamp file (hash of the kube-apiserver/etcd wrapper go.mod/go.sum files +
# their build flags) and a separate .stamp-kubectl (the same for kubectl) make
# re-runs a no-op, so CI can cache $BIN_ROOT keyed by those hashes. kubectl
# has its own stamp so that a directory built before kubectl was added only
# gains kubectl (~1 min with a warm GOCACHE) instead of rebuilding kube-apiserver
# (~5 min).
#
# Environment:
#   BIN_ROOT      where to put binaries (default: <repo>/bin; keep it gitignored)
#   ETCD_BINARY   use this etcd instead of building one, e.g. /usr/bin/etcd from
#                 Debian's etcd-server package (3.4.23 on bookworm; works, but
#                 the apiserver then disables RequestWatchProgress)
#   GOFLAGS/GOPROXY/GOMODCACHE/GOCACHE are honoured as usual.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")" && pwd)
BIN_ROOT=${BIN_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hubsync}
KAS_DIR=$ROOT/kube-apiserver
ETCD_DIR=$ROOT/etcd
KUBECTL_DIR=$ROOT/kubectl

log() { echo "[build-kube-binaries] $*" >&2; }

K8S_VERSION=$(cd "$KAS_DIR" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
KUBECTL_VERSION=$(cd "$KUBECTL_DIR" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [ "$KUBECTL_VERSION" != "$K8S_VERSION" ]; then
	echo "[build-kube-binaries] tools/kubectl pins k8s.io/kubernetes $KUBECTL_VERSION but tools/kube-apiserver pins $K8S_VERSION; run gen-tool-wrappers.sh" >&2
	exit 1
fi
if [ -n "${ETCD_BINARY:-}" ]; then
	ETCD_VERSION=$("$ETCD_BINARY" --version | awk '/etcd Version/ { print "v" $3 }')-external
else
	ETCD_VERSION=$(cd "$ETCD_DIR" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
fi
GOOS=$(go env GOOS)
GOARCH=$(go env GOARCH)
K_MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)

# Static, stripped binaries; stamp the version so /version and --version report
# e.g. v1.35.4 instead of v0.0.0-master+$Format:%H$.
KAS_LDFLAGS="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${K_MINOR} \
 -X k8s.io/component-base/version.gitTreeState=clean"
ETCD_LDFLAGS="-s -w"
# kubectl reports component-base's version (kubectl version --client) and
# client-go's in its User-Agent (kubectl/v1.35.4 instead of kubectl/v0.0.0).
KUBECTL_LDFLAGS="$KAS_LDFLAGS \
 -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${K_MINOR} \
 -X k8s.io/client-go/pkg/version.gitTreeState=clean"

OUT=$BIN_ROOT/k8s-${K8S_VERSION#v}-etcd-${ETCD_VERSION#v}-${GOOS}-${GOARCH}
STAMP=$(cat "$KAS_DIR/go.mod" "$KAS_DIR/go.sum" "$ETCD_DIR/go.mod" "$ETCD_DIR/go.sum" \
	<(echo "$KAS_LDFLAGS $ETCD_LDFLAGS ${ETCD_BINARY:-}") | sha256sum | cut -c1-16)

KUBECTL_STAMP=$(cat "$KUBECTL_DIR/go.mod" "$KUBECTL_DIR/go.sum" <(echo "$KUBECTL_LDFLAGS") | sha256sum | cut -c1-16)

# build_kubectl: (re)build only kubectl into $OUT, which holds a valid
# kube-apiserver and etcd. The binary and its stamp land atomically (rename
# within $OUT), so concurrent runs at worst build it twice.
build_kubectl() {
	local t0 t1 t2 tmp
	tmp=$(mktemp -d "$OUT/.tmp-kubectl.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	t0=$(date +%s)
	log "downloading modules for kubectl ${K8S_VERSION}"
	(cd "$KUBECTL_DIR" && go mod download)
	t1=$(date +%s)
	log "building kubectl ${K8S_VERSION} (~1 min after a kube-apiserver build, ~5 min with an empty GOCACHE, on 2 cores)"
	(cd "$KUBECTL_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$KUBECTL_LDFLAGS" \
		-o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
	t2=$(date +%s)
	echo "$KUBECTL_STAMP" >"$tmp/.stamp-kubectl"
	mv -f "$tmp/kubectl" "$OUT/kubectl"
	mv -f "$tmp/.stamp-kubectl" "$OUT/.stamp-kubectl"
	rm -rf "$tmp"
	trap - EXIT
	log "kubectl: $("$OUT/kubectl" version --client 2>/dev/null | head -1)"
	log "timings: kubectl download $((t1 - t0))s, build $((t2 - t1))s"
}

kubectl_ok() {
	[ -x "$OUT/kubectl" ] && [ "$(cat "$OUT/.stamp-kubectl" 2>/dev/null)" = "$KUBECTL_STAMP" ]
}

if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
	if kubectl_ok; then
		log "up to date: $OUT"
	else
		build_kubectl
	fi
	echo "$OUT"
	exit 0
fi

mkdir -p "$BIN_ROOT"
TMP=$(mktemp -d "$BIN_ROOT/.tmp.XXXXXX")
chmod 0755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

t0=$(date +%s)
log "downloading modules for kube-apiserver ${K8S_VERSION} (GOPROXY=$(go env GOPROXY))"
(cd "$KAS_DIR" && go mod download)
t1=$(date +%s)
log "building kube-apiserver ${K8S_VERSION} (cold: ~4-6 min on 2 cores, ~2 GiB GOCACHE)"
(cd "$KAS_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$KAS_LDFLAGS" \
	-o "$TMP/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
t2=$(date +%s)
if [ -n "${ETCD_BINARY:-}" ]; then
	log "using external etcd $ETCD_BINARY ($ETCD_VERSION)"
	ln -s "$ETCD_BINARY" "$TMP/etcd"
else
	log "building etcd ${ETCD_VERSION}"
	(cd "$ETCD_DIR" && go mod download && CGO_ENABLED=0 go build -trimpath -ldflags "$ETCD_LDFLAGS" \
		-o "$TMP/etcd" go.etcd.io/etcd/server/v3)
fi
t3=$(date +%s)
echo "$STAMP" >"$TMP/.stamp"

rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "kube-apiserver: $("$OUT/kube-apiserver" --version)  etcd: $("$OUT/etcd" --version | head -1)"
log "timings: download $((t1 - t0))s, kube-apiserver build $((t2 - t1))s, etcd $((t3 - t2))s"
build_kubectl
echo "$OUT"
