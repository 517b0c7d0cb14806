#!/usr/bin/env bash
# Build promtool for the alert-rule tests (make alerts-test) using ONLY the
# Go module proxy.
#
# The version comes from the committed wrapper module test/tools/promtool
# (go.mod pins github.com/prometheus/prometheus; tools.go names the command).
#
# Output: the path of the binary, printed on stdout:
#   $BIN_ROOT/promtool-<version>-<goos>-<goarch>/promtool
# A .stamp file (hash of the wrapper's go.mod/go.sum and the build flags)
# makes re-runs a no-op. Built with the remove_all_sd tag: checking and
# unit-testing rule files needs none of the service-discovery plugins, and
# leaving out their cloud SDKs makes the cold build several minutes shorter.
#
# Environment:
#   BIN_ROOT  where to put binaries (default: ~/.cache/hubsync, as
#             build-kube-binaries.sh)
#   GOFLAGS/GOPROXY/GOMODCACHE/GOCACHE are honoured as usual.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")" && pwd)
BIN_ROOT=${BIN_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/hubsync}
MOD_DIR=$ROOT/promtool

log() { echo "[build-promtool] $*" >&2; }

VERSION=$(cd "$MOD_DIR" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
GOOS=$(go env GOOS)
GOARCH=$(go env GOARCH)
TAGS=remove_all_sd
# Stamp the version so promtool --version names the module it was built from.
LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${VERSION#v}"

OUT=$BIN_ROOT/promtool-${VERSION#v}-${GOOS}-${GOARCH}
STAMP=$(cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" <(echo "$TAGS $LDFLAGS") | sha256sum | cut -c1-16)

if [ -x "$OUT/promtool" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
	log "up to date: $OUT/promtool"
	echo "$OUT/promtool"
	exit 0
fi

mkdir -p "$BIN_ROOT"
TMP=$(mktemp -d "$BIN_ROOT/.tmp-promtool.XXXXXX")
chmod 0755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

t0=$(date +%s)
log "downloading modules for promtool ${VERSION} (GOPROXY=$(go env GOPROXY))"
(cd "$MOD_DIR" && go mod download)
t1=$(date +%s)
log "building promtool ${VERSION} (cold: several minutes on 2 cores)"
(cd "$MOD_DIR" && CGO_ENABLED=0 go build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
	-o "$TMP/promtool" github.com/prometheus/prometheus/cmd/promtool)
t2=$(date +%s)
echo "$STAMP" >"$TMP/.stamp"

# The directory lands whole (one rename), so a concurrent run at worst
# builds it twice.
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "$("$OUT/promtool" --version 2>&1 | head -1)"
log "timings: download $((t1 - t0))s, build $((t2 - t1))s"
echo "$OUT/promtool"
