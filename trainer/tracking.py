"""Experiment tracking for `agentflow train` and `agentflow eval` (docs/training.md, "Experiment tracking").

One interface, three backends, chosen by ``open_tracker``:

* **MLflow** when ``MLFLOW_TRACKING_URI`` is set (a server ``http(s)://...``, or a local ``sqlite:///path.db``),
  in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``agentflow``); needs ``mlflow-skinny``
  (``agentflow[tracking]``; a ``sqlite:`` store also needs SQLAlchemy and alembic, which the extra installs);
* **TensorBoard** event files when a folder is configured (the caller's ``tensorboard_dir``, else
  ``AGENTFLOW_TENSORBOARD_DIR``): one sub-folder per run; needs ``tensorboardX`` (or ``tensorboard``, through torch's
  writer);
* **none** otherwise, or when the backend's package is missing or the store cannot be reached (one log line says why):
  tracking never stops a run.

Only numeric metrics are logged (nested dicts flattened with ``.``; strings and booleans are left out). Parameters are
a settings dataclass (or a mapping) flattened the same way, without any field that looks like a secret (its name has
a part such as ``key``, ``token``, ``password`` or ``secret``, or the dataclass hides it from ``repr``); credentials
in a URI (``scheme://user:pass@host``) are masked. Nothing is read from the environment but the variables above.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "agentflow"
SECRET_PARTS = {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential", "credentials", "auth",
                "authorization", "cookie", "sasl"}
_URI_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
_MLFLOW_KEY = re.compile(r"[^\w\-./ ]")  # MLflow names: alphanumerics, _ - . / and space


class Tracker:
    """The interface, and the ``none`` backend: every call does nothing."""

    backend = "none"
    run_id = ""
    run_url = ""

    def log_metrics(self, step: int, metrics: Mapping) -> None:
        """Log the numeric values of ``metrics`` (nested dicts flattened with ``.``) at ``step``."""

    def log_artifact(self, path) -> None:
        """Keep a copy of the file ``path`` with the run (a missing path or an empty one is ignored)."""

    def close(self, status: str = "FINISHED") -> None:
        """End the run (``FINISHED``, or ``FAILED``/``KILLED``); calling it again does nothing."""

    @property
    def link(self) -> dict:
        """What a planner version's metadata records about the run that produced it (empty with no backend)."""
        if self.backend == "none":
            return {}
        return {"tracking": {"backend": self.backend, "run_id": self.run_id, "run_url": self.run_url}}


def open_tracker(run_name: str, params=None, *, tensorboard_dir: str | os.PathLike | None = "",
                 environ: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None) -> Tracker:
    """A started run named ``run_name`` with ``params`` (a dataclass or a mapping; flattened, secrets left out) logged,
    on the backend the environment selects (module docstring). Never raises for tracking's own failures."""
    environ = os.environ if environ is None else environ
    flat = flat_params(params)
    uri = environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        try:
            import mlflow  # noqa: F401  (the client is mlflow-skinny's)
        except ImportError:
            log.warning("experiment tracking: MLFLOW_TRACKING_URI is set but mlflow is not installed "
                        "(pip install 'agentflow[tracking]')%s", "" if _tb_dir(tensorboard_dir, environ)
                        else ": tracking is off")
        else:
            experiment = environ.get("MLFLOW_EXPERIMENT_NAME", "").strip() or DEFAULT_EXPERIMENT
            try:
                tracker = MlflowTracker(uri, experiment, run_name, flat, tags or {})
            except Exception as e:  # an unreachable server or a bad URI must not stop training
                log.warning("experiment tracking: cannot start an MLflow run at %s: %s: tracking is off",
                            mask_uri(uri), e)
                return Tracker()
            log.info("experiment tracking: MLflow run %s (%s)", tracker.run_id, tracker.run_url)
            return tracker
    folder = _tb_dir(tensorboard_dir, environ)
    if folder:
        writer = _summary_writer_class()
        if writer is None:
            log.warning("experiment tracking: a TensorBoard folder is set (%s) but neither tensorboardX nor "
                        "tensorboard is installed (pip install 'agentflow[tracking]'): tracking is off", folder)
            return Tracker()
        try:
            tracker = TensorBoardTracker(writer, Path(folder), run_name, flat)
        except OSError as e:
            log.warning("experiment tracking: cannot write TensorBoard events under %s: %s: tracking is off",
                        folder, e)
            return Tracker()
        log.info("experiment tracking: TensorBoard events in %s", tracker.run_url)
        return tracker
    if not uri:
        log.info("experiment tracking is off: set MLFLOW_TRACKING_URI (MLflow) or a TensorBoard folder "
                 "(AGENTFLOW_TENSORBOARD_DIR)")
    return Tracker()


class MlflowTracker(Tracker):
    """A run in an MLflow tracking store, through ``MlflowClient`` (no global state of the fluent API)."""

    backend = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict, tags: Mapping[str, str]):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        run = self.client.create_run(experiment_id, run_name=run_name,
                                     tags={"mlflow.source.name": run_name, **tags})
        self.run_id, self.experiment_id, self._closed = run.info.run_id, experiment_id, False
        self.run_url = _mlflow_run_url(uri, experiment_id, self.run_id)
        items = [Param(_MLFLOW_KEY.sub("_", k)[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("agentflow.run_name", run_name)])

    def log_metrics(self, step: int, metrics: Mapping) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = [Metric(_MLFLOW_KEY.sub("_", k)[:250], v, now, int(step)) for k, v in numeric_metrics(metrics).items()]
        try:
            for i in range(0, len(values), 1000):
                self.client.log_batch(self.run_id, metrics=values[i:i + 1000])
        except Exception as e:
            log.warning("experiment tracking: MLflow did not take step %s's metrics: %s", step, e)

    def log_artifact(self, path) -> None:
        if path and Path(path).is_file():
            try:
                self.client.log_artifact(self.run_id, str(path))
            except Exception as e:
                log.warning("experiment tracking: MLflow did not take the artifact %s: %s", path, e)

    def close(self, status: str = "FINISHED") -> None:
        if not self._closed:
            self._closed = True
            try:
                self.client.set_terminated(self.run_id, status)
            except Exception as e:
                log.warning("experiment tracking: cannot end the MLflow run %s: %s", self.run_id, e)


class TensorBoardTracker(Tracker):
    """Event files in ``<folder>/<run name>-<time>-<hex>/`` (the run id), with ``params.json`` beside them and the
    parameters as a text summary; artifacts are copied into its ``artifacts/``."""

    backend = "tensorboard"

    def __init__(self, writer_class, folder: Path, run_name: str, params: dict):
        self.run_id = f"{_safe_name(run_name)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.folder = folder / self.run_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self.run_url = str(self.folder.resolve())
        (self.folder / "params.json").write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")
        self.writer = writer_class(str(self.folder))
        table = "| param | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in sorted(params.items()))
        self.writer.add_text("params", table, 0)
        self.writer.flush()
        self._closed = False

    def log_metrics(self, step: int, metrics: Mapping) -> None:
        try:
            for key, value in numeric_metrics(metrics).items():
                self.writer.add_scalar(key, value, int(step))
            self.writer.flush()
        except OSError as e:
            log.warning("experiment tracking: cannot write step %s's TensorBoard events: %s", step, e)

    def log_artifact(self, path) -> None:
        if path and Path(path).is_file():
            try:
                (self.folder / "artifacts").mkdir(exist_ok=True)
                shutil.copy2(path, self.folder / "artifacts" / Path(path).name)
            except OSError as e:
                log.warning("experiment tracking: cannot copy the artifact %s: %s", path, e)

    def close(self, status: str = "FINISHED") -> None:
        if not self._closed:
            self._closed = True
            self.writer.close()


# --- helpers (pure) ----------------------------------------------------------------------------------------------


def is_secret(name: str) -> bool:
    """Whether a parameter name looks like it holds a secret (``api_key``, ``judge_api_key``, ``sasl_password``,
    ``admin_token``; not ``micro_batch_tokens`` or ``keep_last``)."""
    parts = [p for p in re.split(r"[^a-z0-9]+", name.lower()) if p]
    return any(p in SECRET_PARTS for p in parts) or "apikey" in name.lower().replace("_", "").replace("-", "")


def mask_uri(value: str) -> str:
    """``scheme://user:pass@host/...`` with the credentials replaced by ``***``."""
    return _URI_CREDENTIALS.sub("***@", value)


def flat_params(params, prefix: str = "") -> dict[str, str]:
    """A dataclass (nested ones flattened as ``group.field``) or a mapping as ``{name: text}``, secrets left out."""
    if params is None:
        return {}
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        items = [(f.name, getattr(params, f.name)) for f in dataclasses.fields(params) if f.repr]
    elif isinstance(params, Mapping):
        items = list(params.items())
    else:
        raise TypeError(f"tracking params must be a dataclass or a mapping, not {type(params).__name__}")
    out: dict[str, str] = {}
    for name, value in items:
        key = f"{prefix}{name}"
        if is_secret(str(name)):
            continue
        if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or isinstance(value, Mapping):
            out.update(flat_params(value, f"{key}."))
        else:
            out[key] = mask_uri(value if isinstance(value, str) else json.dumps(value, default=str))
    return out


def numeric_metrics(metrics: Mapping, prefix: str = "") -> dict[str, float]:
    """The int and float values of ``metrics`` (nested mappings flattened with ``.``), as floats; booleans, text
    and lists are left out."""
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            out.update(numeric_metrics(value, f"{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def _tb_dir(given, environ: Mapping[str, str]) -> str:
    return str(given or "").strip() or environ.get("AGENTFLOW_TENSORBOARD_DIR", "").strip()


def _summary_writer_class():
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        except ImportError:
            return None
    return SummaryWriter


def _mlflow_run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page on an MLflow server; for a local store, ``<store URI>#<experiment>/<run>``."""
    if uri.startswith(("http://", "https://")):
        return f"{mask_uri(uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{mask_uri(uri)}#/experiments/{experiment_id}/runs/{run_id}"


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
