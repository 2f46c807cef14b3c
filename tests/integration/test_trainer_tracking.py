"""`agentflow train` against the real broker with MLFLOW_TRACKING_URI set (a sqlite store in tmp_path): one MLflow
run holds the settings and every step's metrics, and each version it wrote names the run (docs/training.md,
"Experiment tracking")."""

import json
import uuid

import pytest

from agentflow.bus import topics
from agentflow.trainer.checkpoint import ModelStore
from test_trainer_service import G, publish, rollouts, start_trainer, tiny, training_groups, wait_for  # noqa: F401


def test_each_version_names_the_mlflow_run_that_holds_its_metrics(bus_config, tiny, rollouts, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri, experiment = f"sqlite:///{tmp_path / 'mlflow.db'}", f"trainer-{uuid.uuid4().hex[:6]}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(experiment, artifact_location=str(tmp_path / "artifacts"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
    store, metrics = tmp_path / "store", tmp_path / "metrics.jsonl"
    topics.ensure_topics(bus_config)
    publish(bus_config, training_groups(rollouts, 4))  # 2 groups a step: 2 steps
    trainer = start_trainer(bus_config, tiny, store, metrics, extra=("--max-steps", "2"))
    try:
        wait_for(lambda: trainer.poll() is not None, 180, "the trainer to stop after 2 steps")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        output = trainer.communicate(timeout=30)[0]
    assert trainer.returncode == 0, output[-3000:]

    [run] = client.search_runs([experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "train-v000000"
    assert run.data.params["grpo.group_size"] == str(G) and run.data.params["grpo.lr"] == "0.001"
    assert run.data.params["max_steps"] == "2" and run.data.params["model_store"] == str(store)
    models = ModelStore(store)
    assert models.versions() == [0, 1, 2]
    assert "tracking" not in models.get(0).metadata  # the base, written before the run
    for version in (1, 2):
        link = models.get(version).metadata["tracking"]
        assert link["backend"] == "mlflow" and link["run_id"] == run.info.run_id
        assert link["run_url"] == f"{uri}#/experiments/{experiment_id}/runs/{run.info.run_id}"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2]
    for key in ("reward", "kl", "grad_norm", "version", "records"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(1, pytest.approx(float(steps[0][key]))), (2, pytest.approx(float(steps[1][key])))], key
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["metrics.jsonl"]
