#!/usr/bin/env bash
# Build kube-apiserver and etcd for envtest using ONLY the Go module proxy
# (no GitHub, no dl.k8s.io / storage.googleapis.com, no Docker).
#
# Versions come from the committed wrapper modules tools/kube-apiserver and
# tools/etcd (regenerate them with hack/gen-tool-wrappers.sh).
#
# Output: a directory usable as KUBEBUILDER_ASSETS, printed on stdout:
#   $BIN_ROOT/k8s-<k8s>-etcd-<etcd>-<goos>-<goarch>/{kube-apiserver,etcd}
# A .stamp file (hash of the wrapper go.mod/go.sum files + this script's build
# flags) makes re-runs a no-op, so CI can cache $BIN_ROOT keyed by that hash.
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

log() { echo "[build-kube-binaries] $*" >&2; }

K8S_VERSION=$(cd "$KAS_DIR" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
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

OUT=$BIN_ROOT/k8s-${K8S_VERSION#v}-etcd-${ETCD_VERSION#v}-${GOOS}-${GOARCH}
STAMP=$(cat "$KAS_DIR/go.mod" "$KAS_DIR/go.sum" "$ETCD_DIR/go.mod" "$ETCD_DIR/go.sum" \
	<(echo "$KAS_LDFLAGS $ETCD_LDFLAGS ${ETCD_BINARY:-}") | sha256sum | cut -c1-16)

if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
	log "up to date: $OUT"
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
echo "$OUT"
