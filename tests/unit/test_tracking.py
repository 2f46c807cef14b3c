"""Experiment tracking (trainer/tracking.py): MLflow against a real local store (sqlite in tmp_path), TensorBoard
event files read back with tensorboard's own reader, secrets kept out of the params, the no-backend paths, and
`agentflow eval` logging its run (the tiny model, in-process)."""

import json
import logging
import sys
from dataclasses import dataclass, field

import pytest

from agentflow.bus.config import BusConfig
from agentflow.config import EngineSettings
from agentflow.trainer import tracking
from agentflow.trainer.service import TrainerSettings
from agentflow.trainer.tracking import Tracker, flat_params, numeric_metrics, open_tracker

STEPS = [{"reward": 0.25, "kl": 0.01, "version": 1, "stage": "update", "skipped": False, "batch": {"groups": 2}},
         {"reward": 0.5, "kl": 0.02, "version": 2, "stage": "update", "skipped": False, "batch": {"groups": 3}}]


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI -> a fresh sqlite store in tmp_path (artifacts under tmp_path/mlruns)."""
    pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # a sqlite store's default artifact root is ./mlruns
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "agentflow-test")
    monkeypatch.delenv("AGENTFLOW_TENSORBOARD_DIR", raising=False)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_run_holds_the_params_and_each_steps_metrics(mlflow_store, tmp_path):
    settings = TrainerSettings(model_store=str(tmp_path / "store"), profile="tiny-deterministic")
    tracker = open_tracker("train-v000000", settings)
    assert tracker.backend == "mlflow" and tracker.run_id
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log_metrics(step, metrics)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    tracker.log_artifact(tmp_path / "metrics.jsonl")
    tracker.log_artifact("")  # nothing configured: ignored
    tracker.close()
    tracker.close()  # twice is harmless

    run = mlflow_store.get_run(tracker.run_id)
    experiment = mlflow_store.get_experiment_by_name("agentflow-test")
    assert run.info.experiment_id == experiment.experiment_id and run.info.run_name == "train-v000000"
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model_store"] == str(tmp_path / "store") and params["profile"] == "tiny-deterministic"
    assert params["grpo.group_size"] == str(settings.grpo.group_size) and params["grpo.lr"] == str(settings.grpo.lr)
    assert params["lora.rank"] == str(settings.lora.rank) and params["micro_batch_tokens"] == "0"
    assert history(mlflow_store, tracker.run_id, "reward") == [(1, 0.25), (2, 0.5)]
    assert history(mlflow_store, tracker.run_id, "batch.groups") == [(1, 2.0), (2, 3.0)]
    assert "stage" not in run.data.metrics and "skipped" not in run.data.metrics  # text and booleans are not metrics
    assert [a.path for a in mlflow_store.list_artifacts(tracker.run_id)] == ["metrics.jsonl"]
    assert tracker.link == {"tracking": {"backend": "mlflow", "run_id": tracker.run_id, "run_url": tracker.run_url}}
    assert tracker.run_url.endswith(f"#/experiments/{experiment.experiment_id}/runs/{tracker.run_id}")


def test_mlflow_server_url_names_the_run_page():
    url = tracking._mlflow_run_url("https://user:pw@mlflow.example/", "3", "abc")
    assert url == "https://***@mlflow.example/#/experiments/3/runs/abc"


def test_tensorboard_events_are_written_and_read_back(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = open_tracker("train-v000003", TrainerSettings(profile="p"), tensorboard_dir=tmp_path / "tb")
    assert tracker.backend == "tensorboard"
    for step, metrics in enumerate(STEPS, start=1):
        tracker.log_metrics(step, metrics)
    (tmp_path / "report.md").write_text("# report\n")
    tracker.log_artifact(tmp_path / "report.md")
    tracker.close()

    [folder] = (tmp_path / "tb").iterdir()
    assert folder.name == tracker.run_id and folder.name.startswith("train-v000003-")
    assert str(folder.resolve()) == tracker.run_url and tracker.link["tracking"]["backend"] == "tensorboard"
    events = EventAccumulator(str(folder))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"reward": [(1, 0.25), (2, 0.5)], "kl": [(1, pytest.approx(0.01)), (2, pytest.approx(0.02))],
                       "version": [(1, 1.0), (2, 2.0)], "batch.groups": [(1, 2.0), (2, 3.0)]}
    assert "params/text_summary" in events.Tags()["tensors"]
    params = json.loads((folder / "params.json").read_text())
    assert params["profile"] == "p" and params["grpo.group_size"] == "8"
    assert (folder / "artifacts" / "report.md").read_text() == "# report\n"


def test_the_environment_folder_is_used_when_none_is_given(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("AGENTFLOW_TENSORBOARD_DIR", str(tmp_path / "env-tb"))
    tracker = open_tracker("eval-x", {"kind": "math"})
    tracker.close()
    assert tracker.backend == "tensorboard" and (tmp_path / "env-tb" / tracker.run_id / "params.json").is_file()


@dataclass(frozen=True)
class Hosted:
    endpoint: str = "https://alice:s3cret@llm.example/v1"
    api_key: str = "sk-live-123"
    judge_api_key: str = "sk-judge-456"
    admin_token: str = "adm-789"
    hidden: str = field(default="hush-000", repr=False)
    engine: EngineSettings = EngineSettings(api_key="sk-nested-abc", model="m")
    bus: BusConfig = BusConfig(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
                               sasl_password="kafka-pw-xyz")
    micro_batch_tokens: int = 0
    keep_last: int = 2


SECRETS = ("s3cret", "sk-live-123", "sk-judge-456", "adm-789", "hush-000", "sk-nested-abc", "kafka-pw-xyz")


def test_secrets_are_not_params(mlflow_store):
    flat = flat_params(Hosted())
    assert flat["endpoint"] == "https://***@llm.example/v1" and flat["engine.model"] == "m"
    assert flat["micro_batch_tokens"] == "0" and flat["keep_last"] == "2"  # not secrets by name
    assert not {"api_key", "judge_api_key", "admin_token", "hidden", "engine.api_key", "bus.sasl_password"} & set(flat)
    tracker = open_tracker("secrets", Hosted())
    tracker.close()
    params = mlflow_store.get_run(tracker.run_id).data.params
    assert params["engine.model"] == "m"
    stored = json.dumps(params) + json.dumps(mlflow_store.get_run(tracker.run_id).data.tags)
    assert not [s for s in SECRETS if s in stored]


def test_numeric_metrics_keeps_numbers_only():
    assert numeric_metrics({"a": 1, "b": 0.5, "c": True, "d": "x", "e": [1], "f": {"g": 2, "h": None},
                            "n": float("nan")}) == {"a": 1.0, "b": 0.5, "f.g": 2.0}


def test_no_backend_configured_is_off_with_one_line(monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("AGENTFLOW_TENSORBOARD_DIR", raising=False)
    with caplog.at_level(logging.INFO, logger="agentflow.trainer.tracking"):
        tracker = open_tracker("x", TrainerSettings())
    assert type(tracker) is Tracker and tracker.link == {} and tracker.run_id == ""
    tracker.log_metrics(1, {"reward": 1.0})
    tracker.log_artifact("/nonexistent")
    tracker.close()
    assert len(caplog.records) == 1 and "tracking is off" in caplog.records[0].getMessage()


def test_no_package_installed_is_off_with_one_line(monkeypatch, caplog, tmp_path):
    """MLflow asked for and a TensorBoard folder given, but neither package importable: off, the trainer goes on."""
    for name in ("mlflow", "tensorboardX", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'db'}")
    with caplog.at_level(logging.INFO, logger="agentflow.trainer.tracking"):
        tracker = open_tracker("x", TrainerSettings(), tensorboard_dir=tmp_path / "tb")
    assert type(tracker) is Tracker and not (tmp_path / "tb").exists() and not (tmp_path / "db").exists()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # one per backend asked for
    assert "mlflow is not installed" in messages[0] and "neither tensorboardX nor tensorboard" in messages[1]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentflow.trainer.tracking"):
        assert type(open_tracker("x", {}, tensorboard_dir=tmp_path / "tb")) is Tracker
    assert len(caplog.records) == 1 and "tracking is off" in caplog.records[0].getMessage()


def test_an_unusable_mlflow_uri_turns_tracking_off(monkeypatch, caplog):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus-scheme://nowhere")
    with caplog.at_level(logging.WARNING, logger="agentflow.trainer.tracking"):
        tracker = open_tracker("x", {})
    assert type(tracker) is Tracker
    assert "cannot start an MLflow run" in caplog.text and "tracking is off" in caplog.text


@pytest.mark.slow
def test_eval_logs_its_params_summary_and_reports(mlflow_store, tmp_path, tiny_model_dir):
    """`agentflow eval` with the tiny model: the run's settings, the summary's numbers, and its files."""
    from agentflow.eval import cli as eval_cli

    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"query": "What is 2 plus 3?", "answer": "5"},
                                {"query": "What is 4 times 7?", "answer": "28"}]))
    out = tmp_path / "run"
    code = eval_cli.main(["eval", "--data", str(data), "--kind", "math", "--limit", "2", "--max-steps", "1",
                          "--max-time", "30", "--model", str(tiny_model_dir), "--tools", "python",
                          "--api-key", "sk-eval-secret", "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    experiment = mlflow_store.get_experiment_by_name("agentflow-test")
    [run] = mlflow_store.search_runs([experiment.experiment_id])
    assert run.info.run_name == f"eval-{summary['run']['run_id']}" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["data"] == str(data) and params["kind"] == "math" and params["model"] == str(tiny_model_dir)
    assert params["tools"] == "python" and params["limit"] == "2" and params["max_steps"] == "1"
    assert params["max_time_s"] == "30.0" and "sk-eval-secret" not in json.dumps(params)
    metrics = run.data.metrics
    assert metrics["accuracy"] == summary["accuracy"] and metrics["items.finished"] == 2
    assert metrics["turns.mean"] == summary["turns"]["mean"] and metrics["correct"] == summary["correct"]
    assert not [k for k in metrics if k.startswith("scores") or "histogram" in k]
    artifacts = {a.path for a in mlflow_store.list_artifacts(run.info.run_id)}
    assert {"results.jsonl", "summary.json", "report.md", "report.html"} <= artifacts
