"""Monte-Carlo check of the sequential test: many simulated rollouts at once, through the same ``ArmStats`` and
``policy.decide_codes`` the controller uses, looked at after every trajectory.

    python -m agentflow.rollout.simulate            # the table in docs/rollout.md (defaults: a few minutes)

Each simulated trajectory goes to the canary with the current step's probability; its reward and its error are
Bernoulli draws, its latency log-normal (clipped at the cap, as the controller does).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from agentflow.rollout.policy import CANARY, PROMOTE, ROLLBACK, STABLE, Arms, Policy, decide_codes


@dataclass(frozen=True)
class ArmModel:
    reward: float = 0.6  # P(reward = 1)
    error: float = 0.05  # P(a trajectory's turns all errored); the error share is 0 or 1
    latency_s: float = 10.0  # median latency
    latency_sigma: float = 0.5  # log-normal shape
    rewarded: float = 1.0  # share of trajectories that carry a reward


@dataclass(frozen=True)
class Outcome:
    promoted: float  # share of rollouts that reached 100 %
    rolled_back: float
    undecided: float
    #: canary trajectories when the rollout ended (median, 95th percentile), over the decided rollouts
    canary_samples_p50: float
    canary_samples_p95: float
    trajectories_p50: float  # all trajectories (both arms) when the rollout ended, median
    trajectories_p95: float


def _draw(rng, model: ArmModel, n: int, cap_s: float):
    reward = (rng.random(n) < model.reward).astype(float)
    rewarded = rng.random(n) < model.rewarded
    error = (rng.random(n) < model.error).astype(float)
    latency = np.minimum(1.0, rng.lognormal(np.log(model.latency_s), model.latency_sigma, n) / cap_s)
    return reward, rewarded, error, latency


def simulate(policy: Policy, canary: ArmModel, stable: ArmModel, *, rollouts: int = 1000,
             max_trajectories: int = 20000, seed: int = 0, paired: bool = True) -> Outcome:
    """Run ``rollouts`` independent rollouts for up to ``max_trajectories`` trajectories each (no wall clock: set
    ``policy.timeout_s`` to infinity to see the test alone); ``paired=False`` leaves out the paired reward
    sequence (``Arms``)."""
    rng = np.random.default_rng(seed)
    n = rollouts
    ladder = np.asarray(policy.ladder)
    arms = Arms(policy.alpha, (n,), paired=paired)
    x = np.zeros((2, 3, n))
    mask = np.zeros((2, 3, n), dtype=bool)
    step = np.zeros(n, dtype=int)
    step_base = np.zeros(n)
    active = np.ones(n, dtype=bool)
    outcome = np.zeros(n, dtype=int)
    ended_at = np.full(n, float(max_trajectories))
    ended_canary = np.zeros(n)
    for k in range(1, max_trajectories + 1):
        to_canary = rng.random(n) < ladder[step] / 100
        for arm, model, takes in ((CANARY, canary, active & to_canary), (STABLE, stable, active & ~to_canary)):
            reward, rewarded, error, latency = _draw(rng, model, n, policy.latency_cap_s)
            x[arm] = reward, error, latency
            mask[arm] = takes & rewarded, takes, takes
        arms.add_many(x, mask)
        canary_n = arms.samples(CANARY)
        code, _ = decide_codes(arms, policy, canary_n - step_base, 0.0)
        promote, rollback = active & (code == PROMOTE), active & (code == ROLLBACK)
        final = promote & (step == len(ladder) - 2)
        moving = promote & ~final
        step = np.where(moving, step + 1, step)
        step_base = np.where(moving, canary_n, step_base)
        done = final | rollback
        outcome = np.where(final, PROMOTE, np.where(rollback, ROLLBACK, outcome))
        ended_at = np.where(done, k, ended_at)
        ended_canary = np.where(done, canary_n, ended_canary)
        active &= ~done
        if not active.any():
            break
    decided = outcome != 0
    canary_n = ended_canary[decided] if decided.any() else np.array([np.nan])
    total_n = ended_at[decided] if decided.any() else np.array([np.nan])
    return Outcome(promoted=float(np.mean(outcome == PROMOTE)), rolled_back=float(np.mean(outcome == ROLLBACK)),
                   undecided=float(np.mean(~decided)),
                   canary_samples_p50=float(np.percentile(canary_n, 50)),
                   canary_samples_p95=float(np.percentile(canary_n, 95)),
                   trajectories_p50=float(np.percentile(total_n, 50)),
                   trajectories_p95=float(np.percentile(total_n, 95)))


SCENARIOS = {
    "equal arms": (ArmModel(), ArmModel()),
    "canary worse by exactly the margin (the boundary)": (ArmModel(reward=0.55), ArmModel()),
    "canary reward 0.10 lower": (ArmModel(reward=0.5), ArmModel()),
    "canary reward 0.30 lower": (ArmModel(reward=0.3), ArmModel()),
    "canary reward 0.05 higher": (ArmModel(reward=0.65), ArmModel()),
    "canary with 30% tool errors (stable 5%)": (ArmModel(error=0.3), ArmModel()),
    "canary twice as slow": (ArmModel(latency_s=20.0), ArmModel()),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--max-trajectories", type=int, default=60000)
    parser.add_argument("--min-samples", type=int, default=200)
    parser.add_argument("--reward-margin", type=float, default=0.05)
    parser.add_argument("--error-margin", type=float, default=0.05)
    parser.add_argument("--latency-ratio", type=float, default=1.5)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--ladder", default="10,50,100", help="the canary's traffic shares, comma-separated")
    parser.add_argument("--unpaired", action="store_true", help="without the paired reward sequence (Arms)")
    args = parser.parse_args(argv)
    policy = Policy(min_samples=args.min_samples, reward_margin=args.reward_margin, error_margin=args.error_margin,
                    latency_ratio=args.latency_ratio, alpha=args.alpha, timeout_s=float("inf"),
                    ladder=tuple(int(p) for p in args.ladder.split(",")))
    for name, (canary, stable) in SCENARIOS.items():
        result = simulate(policy, canary, stable, rollouts=args.rollouts, max_trajectories=args.max_trajectories,
                          paired=not args.unpaired)
        print(json.dumps({"scenario": name, **dataclasses.asdict(result)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
