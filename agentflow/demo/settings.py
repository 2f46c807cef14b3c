"""The settings of `agentflow demo`: `DemoSettings` (the flags themselves: agentflow/demo/cli.py), and the settings
of its trainer, drivers and rollout controller: the shipped CPU training profile rendered by the chart with the
differences in differences.yaml. What each setting does: agentflow/demo/run.py and docs/demo.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentflow.errors import InvalidInput

DEFAULT_OUT = ".agentflow/demo"
MAX_STEPS = 3  # planner turns of every query the demo sends (production, held-out evaluations, rollouts): the
# profile's loop.maxSteps (values-dev-cpu.yaml; tests/deploy/test_demo_profile.py)
UNTRAINED = "v000000"  # the version the trainer starts from, and the one --inject-bad-version republishes
TRAFFIC_QPS = 5.0  # --traffic-qps's default, the rate at which the canary's time limits (CANARY_TIME_S) were set
USERS = 200  # --unlabeled: the simulated users who rate (each one rater at the gateway)
SERVING = ("local", "separate", "lora")
FLEET_SLOTS = 3  # separate, lora: versions the rollout fleet holds (the profile's grpo_max_staleness + 1)


@dataclass(frozen=True)
class DemoSettings:
    profile: str = "tiny"  # tiny (random tiny planner, rule-based frozen modules) | smol (SmolLM2 everywhere)
    duration_s: float = 840.0
    target: float = 0.8
    inject_bad_version: bool = False
    out: str = DEFAULT_OUT
    seed: int = 0
    traffic_qps: float = TRAFFIC_QPS
    eval_every_s: float = 45.0
    dashboard: bool = True
    serving: str = "local"  # local | separate | lora (agentflow/demo/run.py's docstring)
    unlabeled: bool = False  # production traffic without ground truth (agentflow/demo/run.py's docstring)
    rated_share: float = 0.3  # --unlabeled: share of answers a simulated user rates
    rating_noise: float = 0.2  # --unlabeled: share of those ratings that are wrong
    opt_out_share: float = 0.1  # --unlabeled: share of query texts whose users opt out of training
    hostile_raters: float = 0.0  # --unlabeled: share of the simulated users who rate every answer the wrong way
    canary_percent: int | None = None  # a canary's first step: 25 % of the traffic, 50 % with --unlabeled

    @property
    def canary_steps(self) -> list[int]:
        """The canary's traffic shares, from its first step through 50 % to promotion at 100 %."""
        first = self.canary_percent or (50 if self.unlabeled else 25)
        return sorted({first, 50, 100} - set(range(first)))

    @property
    def wrong_ratings(self) -> float:
        """The share of all ratings that are wrong: honest users' noise, and every hostile user's rating."""
        return self.rating_noise * (1 - self.hostile_raters) + self.hostile_raters

    def __post_init__(self):
        if self.profile not in ("tiny", "smol"):
            raise InvalidInput(f"--profile must be tiny or smol, got {self.profile!r}")
        if self.serving not in SERVING:
            raise InvalidInput(f"--serving must be one of {', '.join(SERVING)}, got {self.serving!r}")
        if self.duration_s < 60 or not 0 < self.target <= 1 or self.traffic_qps <= 0:
            raise InvalidInput("--duration must be >= 60 s, --target in (0, 1] and --traffic-qps > 0")
        if not (0 <= self.rated_share <= 1 and 0 <= self.rating_noise < 0.5 and 0 <= self.opt_out_share < 1):
            raise InvalidInput("--rated-share must be in [0, 1], --rating-noise in [0, 0.5), --opt-out-share in [0, 1)")
        if not (0 <= self.hostile_raters < 1 and self.wrong_ratings < 0.5):
            raise InvalidInput(f"--hostile-raters with --rating-noise make {self.wrong_ratings:.2f} of the ratings "
                               "wrong; it must stay below 0.5 (the ratings would teach the opposite)")


#: the shipped CPU training profile the demo runs, as the chart renders it (charts/agentflow/values-cpu-train.yaml)
PROFILE_FILES = ("values-dev-cpu.yaml", "values-cpu-train.yaml")
#: the values the demo sets on top of it, each with its reason (this file's sections: ``sections``)
DIFFERENCES = Path(__file__).with_name("differences.yaml")
TRAFFIC_QUERIES = 90  # --unlabeled: production traffic repeats this many distinct train-split queries
# --unlabeled: answers are sampled at a chat product's temperature, so users rate a spread of them (at 1.0 the
# untrained and a trained planner answered production alike too often for the canary test to tell them apart)
TRAFFIC_TEMPERATURE = 0.7
REWARD_MARGIN = 0.15  # on rule rewards; with --unlabeled shrunk by the wrong ratings (differences.yaml)
#: a canary step's time limits at TRAFFIC_QPS (differences.yaml); a slower --traffic-qps stretches them, since they
#: stand for evidence, trajectories per arm (at 2.5 queries/s a version at 0.83 against one at 0.67 timed out at
#: 120 s on the latency test: 160 canary trajectories; it needs about as many as at 5/s, where it decides within 65 s)
CANARY_TIME_S = {"labelled": {"timeout_s": 120, "supersede_s": 60},
                 "unlabeled": {"timeout_s": 600, "supersede_s": 90}}


def sections(settings: DemoSettings) -> list[str]:
    """The sections of differences.yaml that apply to a run with ``settings``."""
    return ["always", "unlabeled" if settings.unlabeled else "labelled",
            *(["smol"] if settings.profile == "smol" else []), *(["lora"] if settings.serving == "lora" else [])]


def differences() -> dict[str, dict[str, dict]]:
    """differences.yaml: section -> value path -> {value or computed, reason}."""
    import yaml

    return yaml.safe_load(DIFFERENCES.read_text())


def computed(settings: DemoSettings) -> dict[str, object]:
    """The values differences.yaml lists as ``computed``, from ``settings``: the canary's steps, its reward margin
    and its time limits."""
    steps = settings.canary_steps
    stretch = max(1.0, TRAFFIC_QPS / settings.traffic_qps)
    limits = CANARY_TIME_S["unlabeled" if settings.unlabeled else "labelled"]
    # wrong ratings shrink the reward gap between two versions by (1 - 2 x their share), and so the margin
    margin = REWARD_MARGIN * (1 - 2 * settings.wrong_ratings) if settings.unlabeled else REWARD_MARGIN
    return {"rollout.settings.canary_percent": steps[0], "rollout.steps": steps,
            "rollout.settings.reward_margin": round(margin, 3),
            **{f"rollout.settings.{name}": round(seconds * stretch, 1) for name, seconds in limits.items()}}


def overlay(settings: DemoSettings) -> dict:
    """The values the demo renders the profile with: the listed differences of its sections, as nested values."""
    listed = differences()
    values = computed(settings)
    for section in sections(settings):
        values.update({path: entry["value"] for path, entry in listed[section].items() if "value" in entry})
    nested: dict = {}
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = nested
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return nested


def behaviour(settings: DemoSettings) -> dict[str, dict[str, str]]:
    """component (trainer, driver or driver-dataset, rollout) -> the settings the chart renders for it from the
    profile and the demo's differences (agentflow/chart.py)."""
    from agentflow import chart

    return chart.behaviour(chart.render([chart.CHART / name for name in PROFILE_FILES], overlay(settings)))
