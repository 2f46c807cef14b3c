"""Settings: ``setting``, ``from_env`` (environment, flags, groups) and the trainer's GRPO group with its old names."""

import logging
from dataclasses import dataclass, fields

import pytest

from agentflow.config import flag_name, from_env, setting
from agentflow.errors import InvalidInput
from agentflow.trainer.grpo import GRPOConfig
from agentflow.trainer.service import OLD_GRPO_NAMES, TrainerSettings, trainer_settings


@dataclass(frozen=True)
class Inner:
    rate: float = setting(0.5, "a rate")
    limit: int | None = setting(3, "a limit (None: none)")


@dataclass(frozen=True)
class Outer:
    name: str = setting("x", "a name")
    on: bool = setting(False, "a switch")
    inner: Inner = setting(Inner(), "a group")


def test_setting_carries_its_help():
    assert {f.name: f.metadata["help"] for f in fields(Inner)} == {"rate": "a rate", "limit": "a limit (None: none)"}


def test_environment_then_flags_then_groups():
    env = {"AGENTFLOW_T_NAME": "env", "AGENTFLOW_T_ON": "yes", "AGENTFLOW_T_INNER_RATE": "0.25",
           "AGENTFLOW_T_INNER_LIMIT": "none"}
    assert from_env(Outer, "T_", environ=env) == Outer("env", True, Inner(0.25, None))
    flagged = from_env(Outer, "T_", environ=env, flags={"name": "flag", "inner.limit": "7", "inner.rate": None})
    assert flagged == Outer("flag", True, Inner(0.25, 7))
    assert flag_name("inner.limit") == "--inner-limit"


@pytest.mark.parametrize("env, flags, message", [
    ({"AGENTFLOW_T_INNER_RATE": "fast"}, {}, "AGENTFLOW_T_INNER_RATE='fast' is not a valid float"),
    ({"AGENTFLOW_T_ON": "maybe"}, {}, "AGENTFLOW_T_ON='maybe' is not a valid bool"),
    ({}, {"inner.limit": "many"}, "--inner-limit='many' is not a valid int"),
])
def test_a_bad_value_names_its_variable_or_flag(env, flags, message):
    with pytest.raises(InvalidInput, match=message):
        from_env(Outer, "T_", environ=env, flags=flags)


# --- the trainer ------------------------------------------------------------------------------------------------


def test_trainer_defaults_keep_the_old_ones():
    s = trainer_settings(environ={})
    assert (s.group_size, s.batch_queries, s.grpo.lr, s.grpo.max_staleness) == (8, 6, 1e-6, 4)
    assert s == TrainerSettings()



def test_the_train_config_comes_from_the_settings():
    """Shared fields pass as they are; the none-values, the source list and the precedence switch are converted."""
    from agentflow.domain.trajectory import RATINGS_FIRST, REWARD_PRECEDENCE

    s = trainer_settings(environ={}, flags={"micro_batch_rows": 7, "device": "cpu", "objective": "last_turn",
                                            "grpo.lr": 3e-6})
    config = s.train_config()
    assert (config.micro_batch_rows, config.device, config.objective, config.grpo) == (7, "cpu", "last_turn", s.grpo)
    assert (config.keep_last, config.behaviour_bound, config.reward_precedence) == (10, 0.2, REWARD_PRECEDENCE)
    assert config.reward_sources == ("rule", "human", "vote", "judge")
    other = TrainerSettings(keep_last=3, behaviour_bound=-1, ratings_over_rule=True, reward_sources="feedback,rule")
    config = other.train_config()
    assert (config.keep_last, config.behaviour_bound, config.reward_precedence) == (3, None, RATINGS_FIRST)
    assert config.reward_sources == ("human", "rule")

def test_new_names(caplog):
    env = {"AGENTFLOW_TRAINER_GRPO_LR": "3e-6", "AGENTFLOW_TRAINER_GRPO_GROUP_SIZE": "4",
           "AGENTFLOW_TRAINER_GRPO_BATCH_TRAJECTORIES": "8", "AGENTFLOW_TRAINER_GRPO_AGGREGATION": "token_mean"}
    with caplog.at_level(logging.WARNING):
        s = trainer_settings(environ=env, flags={"grpo.beta": 0.02})
    assert s.grpo == GRPOConfig(group_size=4, batch_trajectories=8, lr=3e-6, beta=0.02, max_staleness=4,
                                aggregation="token_mean")
    assert s.batch_queries == 2 and not caplog.records


def test_old_names_still_work_with_a_warning(caplog):
    env = {"AGENTFLOW_TRAINER_LEARNING_RATE": "2e-6", "AGENTFLOW_TRAINER_GROUP_SIZE": "4",
           "AGENTFLOW_TRAINER_BATCH_QUERIES": "3", "AGENTFLOW_TRAINER_MAX_STALENESS": "100"}
    with caplog.at_level(logging.WARNING):
        s = trainer_settings(environ=env, flags={"eps_high": "0.28"})
    assert (s.grpo.lr, s.grpo.group_size, s.grpo.batch_trajectories, s.grpo.max_staleness, s.grpo.eps_high) == (
        2e-6, 4, 12, 100, 0.28)
    warned = " ".join(r.getMessage() for r in caplog.records)
    for old, new in [("AGENTFLOW_TRAINER_LEARNING_RATE", "AGENTFLOW_TRAINER_GRPO_LR"),
                     ("AGENTFLOW_TRAINER_BATCH_QUERIES", "AGENTFLOW_TRAINER_GRPO_BATCH_TRAJECTORIES"),
                     ("--eps-high", "--grpo-eps-high")]:
        assert f"{old} is deprecated and will be removed in the next release: use {new}" in warned
    # the old group size alone keeps the old batch: 6 groups of G
    assert trainer_settings(environ={"AGENTFLOW_TRAINER_GROUP_SIZE": "5"}).grpo.batch_trajectories == 30


def test_the_new_name_wins_and_every_old_name_is_mapped():
    env = {"AGENTFLOW_TRAINER_LEARNING_RATE": "2e-6", "AGENTFLOW_TRAINER_GRPO_LR": "5e-6"}
    assert trainer_settings(environ=env).grpo.lr == 5e-6
    assert trainer_settings(environ={}, flags={"learning_rate": "7e-6", "grpo.lr": 9e-6}).grpo.lr == 9e-6
    grpo_fields = {f.name for f in fields(GRPOConfig)}
    assert set(OLD_GRPO_NAMES.values()) <= grpo_fields
    assert not set(OLD_GRPO_NAMES) & {f.name for f in fields(TrainerSettings)}


@pytest.mark.parametrize("env, message", [
    ({"AGENTFLOW_TRAINER_GRPO_LR": "fast"}, "AGENTFLOW_TRAINER_GRPO_LR='fast' is not a valid float"),
    ({"AGENTFLOW_TRAINER_LEARNING_RATE": "fast"}, "AGENTFLOW_TRAINER_GRPO_LR='fast' is not a valid float"),
    ({"AGENTFLOW_TRAINER_BATCH_QUERIES": "six"}, "AGENTFLOW_TRAINER_BATCH_QUERIES='six' is not a valid int"),
    ({"AGENTFLOW_TRAINER_GRPO_GROUP_SIZE": "5"}, "batch must hold whole groups: 48 is not a multiple of G=5"),
    ({"AGENTFLOW_TRAINER_GRPO_EPS_LOW": "1.5"}, r"grpo.eps_low must be in \[0, 1\)"),
    ({"AGENTFLOW_TRAINER_OBJECTIVE": "dpo"}, "objective must be one of flow_grpo, last_turn, sft_success"),
    ({"AGENTFLOW_TRAINER_DYNAMIC_SAMPLING": "true", "AGENTFLOW_TRAINER_GRPO_KEEP_FLAT_GROUPS": "true"},
     "dynamic_sampling drops the groups .* choose one"),
])
def test_a_bad_trainer_value_fails_fast_naming_the_setting(env, message):
    with pytest.raises(InvalidInput, match=message):
        trainer_settings(environ=env)


def test_train_flags_include_the_group_and_the_old_names(capsys):
    from agentflow.cli import _parser

    args = _parser().parse_args(["train", "--grpo-lr", "1e-3", "--batch-queries", "2", "--grpo-group-size", "4"])
    s = trainer_settings(environ={}, flags=vars(args))
    assert (s.grpo.lr, s.grpo.group_size, s.grpo.batch_trajectories) == (1e-3, 4, 8)
    with pytest.raises(SystemExit):
        _parser().parse_args(["train", "--help"])
    shown = capsys.readouterr().out
    assert "--grpo-lr" in shown and "--grpo-max-staleness" in shown and "--learning-rate" not in shown
