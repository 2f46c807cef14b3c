#!/usr/bin/env bash
# Puts `promtool` (Prometheus's rule checker) into a cache folder and prints that folder (the only line on stdout).
#   bash scripts/get-promtool.sh        # -> ${AGENTFLOW_TOOLS_DIR:-$HOME/.cache/agentflow/bin}
# It comes from the distribution's `prometheus` package, fetched with `apt-get download` and unpacked with
# `dpkg -x` (never installed: no service starts, no root needed). Idempotent.
set -euo pipefail

DEST="${AGENTFLOW_TOOLS_DIR:-$HOME/.cache/agentflow/bin}"
log() { echo "get-promtool: $*" >&2; }

if [ -x "$DEST/promtool" ] && "$DEST/promtool" --version >/dev/null 2>&1; then
  echo "$DEST"
  exit 0
fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null || { log "needs apt-get and dpkg (Debian/Ubuntu)"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download prometheus >/dev/null 2>&1) || {
  [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd "$work" && apt-get download prometheus >/dev/null 2>&1)
} || { log "apt-get download prometheus failed"; exit 1; }
dpkg -x "$work"/prometheus_*.deb "$work/x"
mkdir -p "$DEST"
install -m 0755 "$work/x/usr/bin/promtool" "$DEST/promtool"
log "$("$DEST/promtool" --version 2>&1 | head -1)"
echo "$DEST"
