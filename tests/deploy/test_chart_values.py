"""values.schema.json and the chart's own checks reject bad values: `helm template` exits non-zero and says which
setting is wrong."""

from __future__ import annotations

import json
from dataclasses import fields

import jsonschema
import pytest
import yaml

from .conftest import CHART, VALUES_FILES, template

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def test_schema_is_valid_draft7():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def merged(base: dict, override: dict) -> dict:
    """Helm's coalescing of a values file over the defaults (maps merge key by key, anything else replaces)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("values", list(VALUES_FILES.values()))
def test_values_files_satisfy_the_schema(values):
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    profile = yaml.safe_load((CHART / values).read_text()) if values else {}
    jsonschema.validate(merged(defaults, profile), SCHEMA)


def test_kafka_settings_are_busconfig_fields():
    """kafka.settings accepts exactly the BusConfig fields the chart does not set from dedicated values."""
    from agentflow.bus.config import BusConfig

    dedicated = {"bootstrap_servers", "topic_prefix", "partitions", "replication_factor", "create_topics",
                 "security_protocol", "tls_cafile", "tls_certfile", "tls_keyfile", "tls_check_hostname",
                 "sasl_mechanism", "sasl_username", "sasl_password", "enable_auto_commit", "max_record_bytes"}
    allowed = set(SCHEMA["properties"]["kafka"]["properties"]["settings"]["propertyNames"]["enum"])
    assert allowed == {f.name for f in fields(BusConfig)} - dedicated


def write_values(tmp_path, values: dict):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


GPU = CHART / "values-gpu.yaml"

# (values to add, base values file, words the error must contain)
BAD_VALUES = {
    "canary-150": ({"kserve": {"planner": {"canaryTrafficPercent": 150}}}, GPU, ["canaryTrafficPercent", "100"]),
    "canary-negative": ({"kserve": {"frozen": {"canaryTrafficPercent": -5}}}, GPU, ["canaryTrafficPercent"]),
    "canary-not-a-number": ({"kserve": {"planner": {"canaryTrafficPercent": "ten"}}}, GPU, ["canaryTrafficPercent"]),
    "image-repository-empty": ({"image": {"repository": ""}}, None, ["image", "repository"]),
    "image-tag-empty": ({"image": {"tag": ""}}, None, ["image", "tag"]),
    "image-tag-missing": ({"image": {"tag": None}}, None, ["tag"]),
    "trainer-image-missing": ({"trainer": {"image": {"repository": None}}}, GPU, ["trainer", "repository"]),
    "image-digest-malformed": ({"image": {"digest": "md5:abc"}}, None, ["digest"]),
    "negative-replicas": ({"planner": {"replicas": -1}}, None, ["replicas"]),
    "negative-min-replicas": ({"serviceDefaults": {"autoscaling": {"minReplicas": 0}}}, None, ["minReplicas"]),
    "unknown-top-level-key": ({"plannr": {"replicas": 2}}, None, ["plannr"]),
    "unknown-service-key": ({"gateway": {"replica": 2}}, None, ["replica"]),
    "unknown-kafka-setting": ({"kafka": {"settings": {"fetch_wait": 5}}}, None, ["fetch_wait"]),
    "unknown-tool": ({"tools": ["python", "shell"]}, None, ["tools"]),
    "bad-bootstrap": ({"kafka": {"bootstrapServers": "kafka"}}, None, ["bootstrapServers"]),
    "bad-security-protocol": ({"kafka": {"securityProtocol": "TLS"}}, None, ["securityProtocol"]),
    "bad-deployment-mode": ({"kserve": {"deploymentMode": "Serverfull"}}, GPU, ["deploymentMode"]),
    "bad-storage-uri": ({"kserve": {"planner": {"storageUri": "ftp://x/y"}}}, GPU, ["storageUri"]),
    "vllm-arg-owned-by-chart": ({"kserve": {"planner": {"vllmArgs": ["--port=9000"]}}}, GPU, ["vllmArgs"]),
    "root-user": ({"serviceDefaults": {"podSecurityContext": {"runAsNonRoot": False}}}, None, ["runAsNonRoot"]),
    "writable-root": ({"serviceDefaults": {"securityContext": {"readOnlyRootFilesystem": False}}}, None,
                      ["readOnlyRootFilesystem"]),
    "privilege-escalation": ({"serviceDefaults": {"securityContext": {"allowPrivilegeEscalation": True}}}, None,
                             ["allowPrivilegeEscalation"]),
    "added-capability": ({"serviceDefaults": {"securityContext": {"capabilities": {"drop": ["ALL"],
                                                                                   "add": ["SYS_ADMIN"]}}}},
                         None, ["add"]),
    "pdb-both-bounds": ({"serviceDefaults": {"pdb": {"minAvailable": 1, "maxUnavailable": 1}}}, None, ["pdb"]),
    "cpu-target-over-100": ({"gateway": {"autoscaling": {"targetCPUUtilizationPercentage": 150}}}, None,
                            ["targetCPUUtilizationPercentage"]),
    "localhost-seccomp-without-profile": ({"executor": {"sandbox": {"namespaces": True,
                                                                    "seccompProfile": {"type": "Localhost"}}}},
                                          None, ["localhostProfile"]),
    "rollout-step-over-100": ({"rollout": {"steps": [10, 150]}}, GPU, ["steps"]),
    "otel-bad-protocol": ({"otel": {"protocol": "thrift"}}, None, ["protocol"]),
    # the chart's cross-field checks (templates/_helpers.tpl "agentflow.validate")
    "canary-needs-knative": ({"kserve": {"deploymentMode": "Standard", "planner": {"canaryTrafficPercent": 10}},
                              "rollout": {"enabled": False}}, GPU, ["canaryTrafficPercent", "Knative"]),
    "rollout-needs-knative": ({"kserve": {"deploymentMode": "RawDeployment"}}, GPU, ["rollout", "Knative"]),
    "rollout-needs-kserve": ({"rollout": {"enabled": True, "backend": "kserve"}}, None, ["kserve.enabled"]),
    "rollout-must-reach-100": ({"rollout": {"steps": [10, 50]}}, GPU, ["rollout.steps", "100"]),
    "storage-uri-required": ({"kserve": {"planner": {"storageUri": ""}}}, GPU, ["kserve.planner.storageUri"]),
    "no-llm": ({"llmServer": {"enabled": False}}, None, ["no LLM"]),
    "sandbox-namespaces-need-seccomp": ({"executor": {"sandbox": {"namespaces": True}}}, None,
                                        ["executor.sandbox", "seccomp"]),
    "memory-single-replica": ({"memory": {"replicas": 2}}, None, ["memory", "one replica"]),
    "grace-period-too-short": ({"serviceDefaults": {"graceSeconds": 30, "terminationGracePeriodSeconds": 30}}, None,
                               ["terminationGracePeriodSeconds"]),
    "replicas-beyond-partitions": ({"planner": {"autoscaling": {"enabled": True, "maxReplicas": 8}},
                                    "kafka": {"partitions": 4}}, None, ["planner.autoscaling.maxReplicas",
                                                                        "partitions"]),
    "sasl-without-secret": ({"kafka": {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "SCRAM-SHA-512"}}},
                            None, ["kafka.sasl.existingSecret"]),
    "sasl-mechanism-without-sasl": ({"kafka": {"sasl": {"mechanism": "PLAIN"}}}, None, ["SASL_PLAINTEXT"]),
    "trainer-without-store": ({"trainer": {"enabled": True, "modelStore": {"uri": "", "pvc": {"create": False}}}},
                              None, ["trainer.modelStore"]),
    "bootstrap-required": ({"kafka": {"bootstrapServers": ""}}, None, ["kafka.bootstrapServers"]),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_are_rejected_with_a_clear_message(helm, tmp_path, case):
    values, base, words = BAD_VALUES[case]
    files = ([base] if base else []) + [write_values(tmp_path, values)]
    result = template(helm, files, check=False)
    assert result.returncode != 0, f"{case}: rendered although it should not have:\n{result.stdout[:2000]}"
    for word in words:
        assert word in result.stderr, f"{case}: {word!r} not in the error:\n{result.stderr}"


def test_good_overrides_render(helm, tmp_path):
    """The checks are not over-eager: a canary at 0 and at 100, a digest, SASL with its secret all render."""
    values = {
        "image": {"digest": "sha256:" + "a" * 64},
        "kserve": {"planner": {"canaryTrafficPercent": 0}, "frozen": {"canaryTrafficPercent": 100}},
        "kafka": {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "SCRAM-SHA-512", "existingSecret": "kafka-user"},
                  "tls": {"caSecret": "kafka-ca"}},
    }
    result = template(helm, [GPU, write_values(tmp_path, values)])
    assert "canaryTrafficPercent: 0" in result.stdout and "canaryTrafficPercent: 100" in result.stdout
    assert "agentflow@sha256:" + "a" * 64 in result.stdout
