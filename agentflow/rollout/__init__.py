"""The rollout controller (`agentflow rollout`): canaries new planner versions on a serving backend and promotes or
rolls them back by an always-valid sequential comparison of reward, tool errors and latency. See docs/rollout.md."""

from agentflow.rollout.backends import (Backend, BackendError, BackendStatus, LocalBackend, ServedVersion,
                                        UnknownVersion, Version, VersionRejected)
from agentflow.rollout.controller import RolloutController
from agentflow.rollout.policy import Arms, Decision, Policy, decide
from agentflow.rollout.settings import RolloutSettings
from agentflow.rollout.stats import ConfidenceSequence

__all__ = [
    "Arms", "Backend", "BackendError", "BackendStatus", "ConfidenceSequence", "Decision", "LocalBackend", "Policy",
    "RolloutController", "RolloutSettings", "ServedVersion", "UnknownVersion", "Version", "VersionRejected", "decide",
]
