"""The rollout controller's flags `agentflow demo` derives from its settings, parsed by `agentflow rollout` itself."""

import argparse

import pytest

from agentflow.demo.settings import DemoSettings, rollout_flags
from agentflow.rollout import cli


def controller(settings: DemoSettings):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rollout", "--backend", "local", "--llm-admin-url", "http://127.0.0.1:1",
                              *rollout_flags(settings)])
    return cli.settings_from(args, environ={})


@pytest.mark.parametrize("settings, timeout_s, supersede_s", [
    (DemoSettings(), 120, 60),
    (DemoSettings(traffic_qps=2.5), 240, 120),  # half the rate: the same evidence takes twice as long
    (DemoSettings(traffic_qps=10), 120, 60),  # never shorter than at the rate they were set for
    (DemoSettings(unlabeled=True), 600, 90),
    (DemoSettings(unlabeled=True, traffic_qps=1), 3000, 450),
])
def test_a_slower_traffic_stretches_the_canarys_time_limits(settings, timeout_s, supersede_s):
    s = controller(settings)
    assert (s.timeout_s, s.supersede_s) == (timeout_s, supersede_s)
    assert s.supersede_min_rewarded == (250 if settings.unlabeled else 100)  # evidence, not time: unchanged
    assert s.reward_source == ("feedback" if settings.unlabeled else "rule")
