#!/usr/bin/env bash
# Build the konnectivity proxy-server and proxy-agent
# (sigs.k8s.io/apiserver-network-proxy/cmd/{server,agent}) using ONLY the Go
# module proxy (no GitHub, no registry.k8s.io images, no Docker).
#
# The version comes from the committed wrapper module tools/konnectivity
# (bump it with `go get sigs.k8s.io/apiserver-network-proxy@vX.Y.Z
# sigs.k8s.io/apiserver-network-proxy/konnectivity-client@vX.Y.Z && go mod tidy`
# in that directory; keep both at the same tag).
#
# Output: a directory printed on stdout:
#   $BIN_ROOT/konnectivity-<version>-<goos>-<goarch>/{proxy-server,proxy-agent}
# A .stamp file (hash of the wrapper go.mod/go.sum + this script's build flags)
# makes re-runs a no-op, so CI can cache $BIN_ROOT keyed by that hash.
#
# Environment:
#   BIN_ROOT      where to put binaries (default: ${XDG_CACHE_HOME:-~/.cache}/hubsync)
#   GOFLAGS/GOPROXY/GOMODCACHE/GOCACHE are honoured as usual.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")" && pwd)
BIN_ROOT=${BIN_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hubsync}
KONN_DIR=$ROOT/konnectivity
PKG=sigs.k8s.io/apiserver-network-proxy

log() { echo "[build-konnectivity] $*" >&2; }

KONN_VERSION=$(cd "$KONN_DIR" && go list -m -f '{{.Version}}' "$PKG")
GOOS=$(go env GOOS)
GOARCH=$(go env GOARCH)

# Static, stripped binaries. (The server/agent have no version -X variables
# worth stamping; the directory name carries the version.)
LDFLAGS="-s -w"
BUILD_FLAGS="CGO_ENABLED=0 -trimpath -ldflags $LDFLAGS"

OUT=$BIN_ROOT/konnectivity-${KONN_VERSION#v}-${GOOS}-${GOARCH}
STAMP=$(cat "$KONN_DIR/go.mod" "$KONN_DIR/go.sum" <(echo "$BUILD_FLAGS") | sha256sum | cut -c1-16)

if [ -x "$OUT/proxy-server" ] && [ -x "$OUT/proxy-agent" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
	log "up to date: $OUT"
	echo "$OUT"
	exit 0
fi

mkdir -p "$BIN_ROOT"
TMP=$(mktemp -d "$BIN_ROOT/.tmp.XXXXXX")
chmod 0755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

t0=$(date +%s)
log "downloading modules for apiserver-network-proxy ${KONN_VERSION} (GOPROXY=$(go env GOPROXY))"
(cd "$KONN_DIR" && go mod download)
t1=$(date +%s)
log "building proxy-server and proxy-agent ${KONN_VERSION} (cold: ~2 min on 2 cores, ~0.6 GiB GOCACHE)"
(cd "$KONN_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$LDFLAGS" \
	-o "$TMP/proxy-server" "$PKG/cmd/server")
(cd "$KONN_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$LDFLAGS" \
	-o "$TMP/proxy-agent" "$PKG/cmd/agent")
t2=$(date +%s)
echo "$STAMP" >"$TMP/.stamp"

rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "timings: download $((t1 - t0))s, build $((t2 - t1))s"
echo "$OUT"
