"""`agentflow rollout`'s settings: environment names the Helm chart sets, flags on top, validation."""

import argparse
import re
from pathlib import Path

import pytest

from agentflow.errors import InvalidInput
from agentflow.rollout import cli
from agentflow.rollout.settings import RolloutSettings

REPO = Path(__file__).resolve().parents[2]


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["rollout", *argv])


def test_the_command_is_registered_with_its_flags():
    args = parse("--backend", "kserve", "--isvc", "planner-llm", "--namespace", "ml", "--canary-percent", "5",
                 "--steps", "10,50,100", "--min-samples", "50", "--alpha", "0.01", "--timeout-s", "600",
                 "--llm-admin-url", "http://llm:8000")
    assert args.handler is cli.run
    s = cli.settings_from(args, environ={})
    assert (s.backend, s.inference_service, s.namespace, s.min_samples, s.alpha, s.timeout_s, s.llm_url) == (
        "kserve", "planner-llm", "ml", 50, 0.01, 600.0, "http://llm:8000")
    assert s.ladder == (5, 10, 50, 100)


def test_every_variable_the_chart_sets_is_a_setting():
    texts = [(REPO / "charts/agentflow/templates/rollout.yaml").read_text(),
             (REPO / "charts/agentflow/values.yaml").read_text()]
    names = set(re.findall(r"AGENTFLOW_ROLLOUT_([A-Z_]+)", "\n".join(texts)))
    assert {"BACKEND", "INFERENCE_SERVICE", "NAMESPACE", "LLM_URL", "STEPS", "MIN_SAMPLES"} <= names
    fields = {f.upper() for f in RolloutSettings.__dataclass_fields__}
    assert names <= fields  # (rollout.settings keys are upper-cased into further AGENTFLOW_ROLLOUT_* names)


def test_environment_then_flags():
    env = {"AGENTFLOW_ROLLOUT_BACKEND": "kserve", "AGENTFLOW_ROLLOUT_INFERENCE_SERVICE": "agentflow-planner-llm",
           "AGENTFLOW_ROLLOUT_NAMESPACE": "prod", "AGENTFLOW_ROLLOUT_STEPS": "10,50,100",
           "AGENTFLOW_ROLLOUT_MIN_SAMPLES": "200", "AGENTFLOW_ROLLOUT_REWARD_MARGIN": "0.02"}
    s = cli.settings_from(parse(), environ=env)
    assert (s.backend, s.inference_service, s.namespace, s.min_samples, s.reward_margin) == (
        "kserve", "agentflow-planner-llm", "prod", 200, 0.02)
    s = cli.settings_from(parse("--min-samples", "30", "--backend", "local"), environ=env)
    assert (s.backend, s.min_samples) == ("local", 30)
    # a flag may complete what the environment alone would not pass
    s = cli.settings_from(parse("--isvc", "p"), environ={"AGENTFLOW_ROLLOUT_BACKEND": "kserve"})
    assert s.inference_service == "p"


@pytest.mark.parametrize("overrides, message", [
    ({"backend": "argo"}, "BACKEND must be one of local, separate, lora, kserve"),
    ({"kserve_mode": "blue"}, "KSERVE_MODE must be one of canary, pair"),
    ({"drain_s": -1}, "DRAIN_S must be at least 0"),
    ({"supersede_s": -1}, "SUPERSEDE_S must be at least 0"),
    ({"backend": "kserve"}, "needs AGENTFLOW_ROLLOUT_INFERENCE_SERVICE"),
    ({"steps": "10,50"}, "end at 100"),
    ({"steps": "50,10,100"}, "rise strictly"),
    ({"steps": "ten"}, "comma-separated integers"),
    ({"canary_percent": 100}, "CANARY_PERCENT must be in [1, 99]"),
    ({"alpha": 0.7}, "ALPHA must be in (0, 0.5)"),
    ({"latency_ratio": 0.5}, "LATENCY_RATIO must be at least 1"),
    ({"timeout_action": "ignore"}, "rollback or promote"),
    ({"reward_source": "thumbs"}, "REWARD_SOURCE must be one of"),
    ({"tripwire_min_samples": -1}, "TRIPWIRE_MIN_SAMPLES must be at least 0"),
    ({"tripwire_refusal_rate": 0}, "TRIPWIRE_REFUSAL_RATE must be in (0, 1]"),
    ({"tripwire_answer_divergence": 1.5}, "TRIPWIRE_ANSWER_DIVERGENCE must be in (0, 1]"),
    ({"tripwire_answer_length": 1.0}, "TRIPWIRE_ANSWER_LENGTH must be above 1"),
])
def test_bad_settings_fail_fast_naming_the_setting(overrides, message):
    with pytest.raises(InvalidInput, match=re.escape(message)):
        RolloutSettings(**overrides)


def test_bad_environment_values_name_the_variable():
    with pytest.raises(InvalidInput, match="AGENTFLOW_ROLLOUT_MIN_SAMPLES='many'"):
        cli.settings_from(parse(), environ={"AGENTFLOW_ROLLOUT_MIN_SAMPLES": "many"})


def test_the_admin_token_stays_out_of_reprs():
    assert "s3cret" not in repr(RolloutSettings(admin_token="s3cret"))


def test_tripwire_bounds_from_the_environment_and_the_flag():
    env = {"AGENTFLOW_ROLLOUT_TRIPWIRE_REFUSAL_RATE": "0.2", "AGENTFLOW_ROLLOUT_TRIPWIRE_ANSWER_LENGTH": "3"}
    s = cli.settings_from(parse("--tripwire-min-samples", "50"), environ=env)
    bounds = s.policy().tripwires
    assert (bounds.min_samples, bounds.refusal_rate, bounds.answer_length, bounds.tool_error_rate) == (50, 0.2, 3.0,
                                                                                                       0.15)
    assert cli.settings_from(parse("--tripwire-min-samples", "0"), environ={}).tripwires.min_samples == 0  # off
