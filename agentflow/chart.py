"""The Helm chart as the one source of a profile's behaviour. ``helm template`` renders a shipped values profile, and
``behaviour`` reads from it the settings that decide whether the loop learns: each setting the trainer, the
rollout drivers and the rollout controller get, less where they run and whom they call (``PLACEMENT``), which a
local runner sets for its own machine. ``agentflow demo`` starts its processes with these (docs/demo.md,
"The profile it runs"); a cluster gets the same values from the same rendering."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from agentflow.errors import InvalidInput

CHART = Path(__file__).resolve().parents[1] / "charts" / "agentflow"
RENDER_TIMEOUT_S = 60.0
#: component label of a workload -> the prefix of its settings' variables
PREFIXES = {"trainer": "AGENTFLOW_TRAINER_", "driver": "AGENTFLOW_DRIVE_", "driver-dataset": "AGENTFLOW_DRIVE_",
            "rollout": "AGENTFLOW_ROLLOUT_"}
#: settings that place a workload and name its peers (addresses, ports, stores, secrets, the serving backend): a
#: runner sets them for where it runs; they are no part of how the loop behaves
PLACEMENT = frozenset({
    "MODEL_STORE", "BASE_MODEL", "METRICS_PORT", "METRICS_HOST", "GATEWAY", "API_KEY", "DATASET", "BOOTSTRAP",
    "BACKEND", "DEPLOYMENT", "KSERVE_MODE", "KSERVE_OPENAI_PATH", "INFERENCE_SERVICE", "SERVED_MODEL_NAME",
    "NAMESPACE", "LLM_URL", "ADMIN_TOKEN", "SERVING_URL", "PIN_ENDPOINT", "FLEET_URL", "FLEET_KIND", "FLEET_SLOTS",
    "FLEET_SERVING_URL", "FLEET_ADMIN_TOKEN", "FLEET_MIRROR"})


def find_tool(name: str) -> str | None:
    """helm, kubectl or promtool: ``$AGENTFLOW_<NAME>``, else the folder scripts/get-helm.sh and
    scripts/get-promtool.sh fill (``$AGENTFLOW_TOOLS_DIR``, default ~/.cache/agentflow/bin), else the venv's bin
    folder, else PATH."""
    explicit = os.environ.get(f"AGENTFLOW_{name.upper()}")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    folders = [Path(os.environ.get("AGENTFLOW_TOOLS_DIR") or Path.home() / ".cache" / "agentflow" / "bin"),
               CHART.parents[1] / ".venv" / "bin"]
    for folder in folders:
        if (folder / name).is_file() and os.access(folder / name, os.X_OK):
            return str(folder / name)
    return shutil.which(name)


def render(values_files: list[str | Path], overlay: dict | None = None, release: str = "agentflow",
           namespace: str = "agentflow") -> list[dict]:
    """The objects ``helm template`` renders from the chart with ``values_files`` (in order) and then ``overlay``;
    InvalidInput with helm's message where the chart refuses them."""
    import yaml

    helm = find_tool("helm")
    if helm is None:
        raise InvalidInput("helm not found: bash scripts/get-helm.sh installs it (scripts/install.sh does)")
    if not CHART.is_dir():
        raise InvalidInput(f"the chart is not at {CHART}: run from a checkout of the repository")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="agentflow-overlay-") as extra:
        yaml.safe_dump(overlay or {}, extra)
        extra.flush()
        argv = [helm, "template", release, str(CHART), "--namespace", namespace,
                *(x for f in values_files for x in ("-f", str(f))), "-f", extra.name]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise InvalidInput(f"helm template took more than {RENDER_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise InvalidInput(f"the chart refused the profile: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def behaviour(objects: list[dict]) -> dict[str, dict[str, str]]:
    """component -> {variable: value}: the settings each of ``PREFIXES``' workloads gets as a literal value, less
    ``PLACEMENT``. Variables from Secrets or the downward API are placement by nature and left out."""
    found: dict[str, dict[str, str]] = {}
    for obj in objects:
        component = obj.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
        if component not in PREFIXES or obj.get("kind") not in ("Deployment", "Job", "PyTorchJob"):
            continue
        prefix = PREFIXES[component]
        for container in _containers(obj):
            for var in container.get("env") or []:
                name = var["name"]
                if name.startswith(prefix) and "value" in var and name.removeprefix(prefix) not in PLACEMENT:
                    found.setdefault(component, {})[name] = str(var["value"])
    return found


def _containers(obj: dict) -> list[dict]:
    """The containers of a Deployment's or Job's pod template, or of a PyTorchJob's replica templates."""
    spec = obj.get("spec", {})
    if obj["kind"] == "PyTorchJob":
        templates = [r["template"] for r in spec.get("pytorchReplicaSpecs", {}).values()]
    else:
        templates = [spec.get("template", {})]
    return [c for t in templates for c in t.get("spec", {}).get("containers", [])]
