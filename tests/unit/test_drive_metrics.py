"""`agentflow drive --metrics-port`: the rollouts sent, answered and failed and the groups started, as Prometheus
counters on /metrics (the chart's driver Deployment is scraped and probed there). No gateway: a stand-in answers."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import grpc
import pytest
from prometheus_client import REGISTRY

from agentflow.errors import InvalidInput
from agentflow.trainer import drive as drive_module
from agentflow.trainer.drive import DriveSettings, drive

SAMPLES = {"sent": ("agentflow_drive_rollouts_sent_total", {}),
           "answered": ("agentflow_drive_rollouts_answered_total", {}),
           "failed": ("agentflow_drive_rollouts_failed_total", {"error": "INVALID_ARGUMENT"}),
           "groups": ("agentflow_drive_groups_total", {})}


class Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.INVALID_ARGUMENT  # not a busy code: no back-off


class StandInGateway:
    """Answers every query but "refused", which it refuses."""

    def __init__(self, target: str, api_key: str = ""):
        self.target, self.api_key = target, api_key

    def solve(self, query: str, **_):
        if query == "refused":
            raise Refused()
        return SimpleNamespace(answer="4", status="ok")

    def close(self) -> None:
        pass


def counts() -> dict[str, float]:
    return {key: REGISTRY.get_sample_value(name, labels) or 0.0 for key, (name, labels) in SAMPLES.items()}


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(drive_module, "Gateway", StandInGateway)
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"query": "What is 2+2?", "answer": "4"}) + "\n"
                    + json.dumps({"query": "refused", "answer": "4"}) + "\n")
    return str(path)


def test_counters_follow_the_rollouts_and_are_served(dataset):
    lines: list[str] = []
    before = counts()
    # 4 groups of 3 in shuffled passes over 2 queries: 2 groups of each, 6 rollouts answered and 6 refused
    result = drive(DriveSettings(dataset=dataset, group_size=3, groups=4, concurrency=2, metrics_port=0),
                   progress=lines.append)
    after = counts()
    assert (result["sent"], result["answered"], result["failed"], result["groups"]) == (12, 6, 6, 4)
    assert {key: after[key] - before[key] for key in SAMPLES} == {"sent": 12, "answered": 6, "failed": 6,
                                                                   "groups": 4}
    (url,) = [json.loads(line)["url"] for line in lines if json.loads(line)["event"] == "drive_metrics"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for name, labels in SAMPLES.values():
        assert name in text
    assert 'agentflow_drive_rollouts_failed_total{error="INVALID_ARGUMENT"}' in text


def test_no_metrics_port_no_counting(dataset):
    before = counts()
    lines: list[str] = []
    result = drive(DriveSettings(dataset=dataset, group_size=2, groups=2), progress=lines.append)
    assert result["sent"] == 4
    assert counts() == before
    assert not [line for line in lines if json.loads(line)["event"] == "drive_metrics"]


def test_the_metrics_settings(monkeypatch):
    import argparse

    from agentflow.config import from_env
    from agentflow.trainer.cli import add_parsers

    with pytest.raises(InvalidInput, match="metrics_port"):
        DriveSettings(metrics_port=-2)
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["drive", "--metrics-port", "9090", "--metrics-host", "0.0.0.0"])
    settings = from_env(DriveSettings, "DRIVE_", environ={}, flags=vars(args))
    assert (settings.metrics_port, settings.metrics_host) == (9090, "0.0.0.0")
    settings = from_env(DriveSettings, "DRIVE_", environ={"AGENTFLOW_DRIVE_METRICS_PORT": "9091"})
    assert settings.metrics_port == 9091
