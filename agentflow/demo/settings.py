"""The settings of `agentflow demo`: `DemoSettings` and the training and rollout flags of each profile (the flags
themselves: agentflow/demo/cli.py). What each setting does: agentflow/demo/run.py and docs/demo.md."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.errors import InvalidInput

DEFAULT_OUT = ".agentflow/demo"
MAX_STEPS = 3  # planner turns of every query the demo sends (production, held-out evaluations, rollouts)
UNTRAINED = "v000000"  # the version the trainer starts from, and the one --inject-bad-version republishes
TRAFFIC_QPS = 5.0  # --traffic-qps's default, the rate at which the canary's time limits (CANARY_TIME_S) were set
USERS = 200  # --unlabeled: the simulated users who rate (each one rater at the gateway)
SERVING = ("local", "separate", "lora")
FLEET_SLOTS = 3  # separate, lora: versions the rollout fleet holds (the trainer's max staleness + 1, see PROFILES)
LORA_TRAINER = ["--lora-rank", "16", "--lora-alpha", "32", "--export", "adapter"]  # --serving lora


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


# the training and rollout settings of each profile (docs/demo.md says why)
PROFILES = {
    "tiny": {"trainer": ["--grpo-group-size", "8", "--grpo-batch-trajectories", "48", "--grpo-lr", "1e-3",
                         "--grpo-beta", "0.02", "--grpo-updates-per-batch", "2", "--grpo-max-staleness", "2",
                         "--format-warmup-steps", "30", "--grpo-keep-flat-groups", "true"],
             # at most (max_staleness + 1) x 6 groups a step sent that the trainer has not finished; rollouts
             # hotter than 1 keep a rarely chosen tool sampled while the evidence is thin (docs/demo.md, Choices)
             "drive": ["--group-size", "8", "--concurrency", "12", "--max-ahead-groups", "18",
                       "--temperature", "1.3"]},
    "smol": {"trainer": ["--grpo-group-size", "4", "--grpo-batch-trajectories", "8", "--grpo-lr", "1e-5",
                         "--grpo-beta", "0.02", "--grpo-max-staleness", "2"],
             "drive": ["--group-size", "4", "--concurrency", "4", "--max-ahead-groups", "6"]},
}
#: --unlabeled: what rewards the trainer and the controller use (docs/demo.md)
UNLABELED = {"trainer": ["--reward-sources", "human,vote", "--reward-wait-s", "20"],
             # a third of the answers is rated: a larger canary share and longer steps collect the evidence
             # an undecided canary yields to the newest version after 90 s: half the traffic, and so the ratings
             # the ledger learns from, stay on recent versions; but only once it has 250 rated trajectories, the
             # evidence that decides a trained version at 0.67 against the untrained one in 99.8 % of simulated
             # rollouts (42 % at the labelled demo's 100: canaries at 0.67 yielded undecided, docs/demo.md)
             "rollout": ["--reward-source", "feedback", "--supersede-min-rewarded", "250"]}
TRAFFIC_QUERIES = 90  # --unlabeled: production traffic repeats this many distinct train-split queries
# --unlabeled: answers are sampled at a chat product's temperature, so users rate a spread of them (at 1.0 the
# untrained and a trained planner answered production alike too often for the canary test to tell them apart)
TRAFFIC_TEMPERATURE = 0.7
REWARD_MARGIN = 0.15  # the controller's, on rule rewards: a canary this much worse is rolled back
# The latency test resolves latency in steps of about 11 / n of the cap (n: trajectories per arm): at 3 s it passes
# after about 100 per arm; at 10 s every canary of a loaded 2-core run timed out on it (docs/demo.md).
# A canary of a version about as good as the stable one (the 0.67 plateau) rarely decides within a step; after 60 s
# it yields to the newest waiting version instead of holding the slot to the 120 s timeout (docs/demo.md).
# It yields only once it has 100 rewarded trajectories (about 40 s of idle cores' traffic; 250 rated ones with
# --unlabeled, UNLABELED above): on a loaded machine the traffic slows, and canaries superseded on seconds alone
# each started over from no evidence, and most left undecided (docs/demo.md).
# The tripwires fire after 50 trajectories per arm (100 by default): the asks-back version --inject-bad-version
# publishes (a third of its answers ask back) is then rolled back within a canary step on a loaded machine, and the
# refusal bound (0.10) is still 2.2 standard errors of noise at a trained planner's rate of 0.05 (docs/demo.md).
ROLLOUT = ["--min-samples", "20", "--tripwire-min-samples", "50",
           "--reward-margin", str(REWARD_MARGIN), "--error-margin", "0.25", "--latency-ratio", "10",
           "--latency-cap-s", "3", "--supersede-min-rewarded", "100",
           "--timeout-action", "rollback", "--drain-s", "70"]  # a query takes 60 s at most
# A canary's time limits at TRAFFIC_QPS: a step undecided this long rolls back (--timeout-s) or yields to a newer
# version (--supersede-s). They stand for evidence, trajectories per arm, so a slower --traffic-qps stretches them
# (``rollout_flags``): at 2.5 queries/s a version at 0.83 against one at 0.67 timed out at 120 s on the latency test
# (160 canary trajectories; it needs about as many as at 5/s, where it decides within 65 s).
CANARY_TIME_S = {"labelled": {"--timeout-s": 120, "--supersede-s": 60},
                 "unlabeled": {"--timeout-s": 600, "--supersede-s": 90}}  # a third of the answers rated


def rollout_flags(settings: DemoSettings) -> list[str]:
    """The rollout controller's flags: its canary steps and time limits, and with --unlabeled its feedback
    settings."""
    steps = settings.canary_steps
    stretch = max(1.0, TRAFFIC_QPS / settings.traffic_qps)
    limits = CANARY_TIME_S["unlabeled" if settings.unlabeled else "labelled"]
    flags = [*ROLLOUT, "--canary-percent", str(steps[0]), "--steps", ",".join(map(str, steps)),
             *(x for flag, seconds in limits.items() for x in (flag, f"{seconds * stretch:g}"))]
    return [*flags, *_unlabeled_rollout(settings)] if settings.unlabeled else flags


def _unlabeled_rollout(settings: DemoSettings) -> list[str]:
    """The controller on feedback: wrong ratings shrink the reward gap between two versions by (1 - 2 x noise),
    and so the margin (docs/rewards.md)."""
    margin = REWARD_MARGIN * (1 - 2 * settings.wrong_ratings)
    return [*UNLABELED["rollout"], "--reward-margin", f"{margin:.3f}"]
