"""The CPU overlay that runs values-gpu.yaml on two cores (charts/agentflow/ci/gpu-on-cpu.yaml, bench/chart_loop.py)
changes only model size, resources, replicas, storage and endpoints, and the one listed difference (KServe's
predictors as the local llm server): the trainer's, the drivers' and the rollout controller's settings render as the
profile's own."""

from __future__ import annotations

import fnmatch

import yaml

from agentflow import chart

OVERLAY = chart.CHART / "ci" / "gpu-on-cpu.yaml"
ALLOWED = {
    "model size": ["llmServer.model", "llmServer.maxBatch", "trainer.baseModel", "judge.model",
                   "serviceDefaults.env.AGENTFLOW_PROFILE", "serviceDefaults.env.AGENTFLOW_ENVIRONMENT"],
    "resources": ["*.resources", "trainer.gpusPerNode", "*.nodeSelector", "*.tolerations"],
    "replicas": ["*.autoscaling.enabled", "keda.enabled"],
    "storage": ["trainer.modelStore.*"],
    "endpoints": ["kafka.*", "strimzi.enabled", "otel.enabled"],
    "listed: KServe's predictors as the local llm server": ["kserve.enabled", "llmServer.enabled",
                                                            "llmServer.adminTokenSecret", "rollout.backend"],
}


def leaves(node: dict, prefix: str = "") -> dict[str, object]:
    found = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            found.update(leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def test_the_overlay_changes_only_what_it_may():
    patterns = [p for group in ALLOWED.values() for p in group]
    changed = leaves(yaml.safe_load(OVERLAY.read_text()))
    assert changed
    outside = [path for path in changed if not any(fnmatch.fnmatchcase(path, p) for p in patterns)]
    assert outside == [], f"the overlay changes {outside}: neither model size, resources, replicas, storage, " \
                          "endpoints nor a listed difference"


def test_every_profiles_kafka_compression_is_installed(helm):
    """values-gpu.yaml's zstd failed every producer until kafka-python's zstd extra was installed (found by running
    the rendered profile)."""
    from kafka import codec

    for files in (["values.yaml"], ["values-dev-cpu.yaml"], ["values-gpu.yaml"]):
        config = next(o for o in chart.render([chart.CHART / f for f in files], {"kafka": {"bootstrapServers": "x:1"}})
                      if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-env"))
        compression = config["data"].get("AGENTFLOW_KAFKA_COMPRESSION_TYPE", "")
        assert not compression or getattr(codec, f"has_{compression}")(), (files, compression)


def test_the_profile_behaves_as_installed_under_the_overlay(helm):
    kafka = {"kafka": {"bootstrapServers": "127.0.0.1:9092"}}
    installed = chart.behaviour(chart.render([chart.CHART / "values-gpu.yaml"]))
    local = chart.behaviour(chart.render([chart.CHART / "values-gpu.yaml", OVERLAY], kafka))
    assert set(installed) == {"trainer", "driver", "rollout"}
    assert local == installed
