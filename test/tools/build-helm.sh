#!/usr/bin/env bash
# Build the helm CLI, major version 3 or 4, for the chart's install test
# (test/chart), using ONLY the Go module proxy.
#
# Usage: build-helm.sh 3|4
#
# The version comes from the committed wrapper module test/tools/helm<major>
# (go.mod pins helm.sh/helm/v<major>; tools.go names the command).
#
# Output: the path of the binary, printed on stdout:
#   $BIN_ROOT/helm-<version>-<goos>-<goarch>/helm
# A .stamp file (hash of the wrapper's go.mod/go.sum and the build flags)
# makes re-runs a no-op.
#
# Environment:
#   BIN_ROOT  where to put binaries (default: ~/.cache/hubsync, as
#             build-kube-binaries.sh)
#   GOFLAGS/GOPROXY/GOMODCACHE/GOCACHE are honoured as usual.
set -euo pipefail

MAJOR=${1:?usage: build-helm.sh 3|4}
case "$MAJOR" in 3|4) ;; *) echo "build-helm.sh: major version 3 or 4, not $MAJOR" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")" && pwd)
BIN_ROOT=${BIN_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hubsync}
MOD_DIR=$ROOT/helm$MAJOR
MODULE=helm.sh/helm/v$MAJOR

log() { echo "[build-helm] $*" >&2; }

VERSION=$(cd "$MOD_DIR" && go list -m -f '{{.Version}}' "$MODULE")
GOOS=$(go env GOOS)
GOARCH=$(go env GOARCH)
# Stamp the version so `helm version` names the module it was built from.
LDFLAGS="-s -w -X $MODULE/internal/version.version=$VERSION"

OUT=$BIN_ROOT/helm-${VERSION#v}-${GOOS}-${GOARCH}
STAMP=$(cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" <(echo "$LDFLAGS") | sha256sum | cut -c1-16)

if [ -x "$OUT/helm" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
	log "up to date: $OUT/helm"
	echo "$OUT/helm"
	exit 0
fi

mkdir -p "$BIN_ROOT"
TMP=$(mktemp -d "$BIN_ROOT/.tmp-helm.XXXXXX")
chmod 0755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

t0=$(date +%s)
log "downloading modules for helm ${VERSION} (GOPROXY=$(go env GOPROXY))"
(cd "$MOD_DIR" && go mod download)
t1=$(date +%s)
log "building helm ${VERSION} (cold: a few minutes on 2 cores)"
(cd "$MOD_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$LDFLAGS" -o "$TMP/helm" "$MODULE/cmd/helm")
t2=$(date +%s)
echo "$STAMP" >"$TMP/.stamp"

# The directory lands whole (one rename), so a concurrent run at worst
# builds it twice.
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "$("$OUT/helm" version --short 2>&1 | head -1)"
log "timings: download $((t1 - t0))s, build $((t2 - t1))s"
echo "$OUT/helm"
