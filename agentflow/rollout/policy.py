"""The canary decision, as pure functions of the two arms' statistics.

Three metrics are compared, each with an always-valid confidence sequence per arm (``stats.ConfidenceSequence``):

| metric | per trajectory (in [0, 1]) | canary is **worse** (rollback) when | canary **passes** when |
|---|---|---|---|
| reward | the reward of the configured source | upper(mu_c - mu_s) < -reward_margin | lower(mu_c - mu_s) > -reward_margin |
| error_rate | share of turns with a tool or parse error | lower(e_c - e_s) > error_margin | upper(e_c - e_s) <= error_margin |
| latency | latency / latency_cap_s | lower(l_c - ratio * l_s) > 0 | upper(l_c - ratio * l_s) <= 0 |

The reward difference has a seventh sequence of its own: the arms' rewards are paired in arrival order (the oldest
waiting reward of each arm), and ``(r_c - r_s + 1) / 2`` is one more bounded stream whose mean is
``(mu_c - mu_s + 1) / 2``. Its width follows the variance of one difference instead of adding two arms' widths, so
with comparable traffic on both arms it needs about half the trajectories; the reward bounds are the intersection of
the two intervals (the per-arm one stays the tighter where the canary's share is small).

The error budget ``alpha`` is split evenly over the seven sequences (three metrics on two arms, and the paired
reward difference): with probability at least 1 - alpha every sequence covers its true mean at every moment of the
rollout, and then no decision the controller takes on evidence is wrong — it never rolls back a canary that is
within all margins, and never promotes one that is outside any of them — however often it looks and across all
steps. Pairing in arrival order looks at no value, so each pair is a fresh draw from both arms.

Gating: nothing is decided before both arms have ``min_samples`` trajectories (and ``min_samples`` rewarded ones for
the reward comparison); a step is passed only after ``min_samples`` canary trajectories *in that step*; a rollback
needs one metric proven worse, a promotion all three proven not worse. A step that reaches ``timeout_s`` without
either takes ``timeout_action``.

Tripwires (``tripwires.py``) come first: one that fires rolls the canary back whatever the test says (also at a
timeout), and its evidence is a ``Comparison`` named ``tripwire:<name>`` with the verdict ``TRIPPED`` (the
statistic as both bounds, its bound as the margin); the trainer reads that verdict to quarantine the version's
training groups (``agentflow.versions.quarantined_version``).

``decide_codes`` works elementwise on numpy arrays of rollouts (``agentflow.rollout.simulate``, the tests);
``decide`` is the scalar wrapper the controller uses, with the reason and the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agentflow.rollout import tripwires as tw
from agentflow.rollout.stats import ConfidenceSequence
from agentflow.versions import TRIPPED

HOLD, PROMOTE, ROLLBACK = 0, 1, 2
METRICS = ("reward", "error_rate", "latency")
SEQUENCES_PER_ROLLOUT = 2 * len(METRICS) + 1  # the alpha split: each arm's three, and the paired reward difference
PAIRING_BUFFER = 256  # rewards of one arm waiting for the other's; beyond it the oldest is dropped (the other arm's
                      # share is small then, and the per-arm sequences carry the comparison)


@dataclass(frozen=True)
class Policy:
    """What the decision needs from the settings (see ``RolloutSettings`` for the meaning of each)."""

    ladder: tuple[int, ...] = (10, 50, 100)
    min_samples: int = 200
    alpha: float = 0.05
    reward_margin: float = 0.05
    error_margin: float = 0.05
    latency_ratio: float = 1.5
    latency_cap_s: float = 120.0
    timeout_s: float = 6 * 3600.0
    timeout_action: str = "rollback"
    tripwires: tw.TripwireBounds = field(default_factory=tw.TripwireBounds)

    def __post_init__(self):
        if not self.ladder or list(self.ladder) != sorted(set(self.ladder)) or self.ladder[-1] != 100 \
                or self.ladder[0] < 1:
            raise ValueError(f"the canary ladder must rise strictly from at least 1 to 100, got {self.ladder}")
        if self.timeout_action not in ("rollback", "promote"):
            raise ValueError(f"timeout_action must be rollback or promote, got {self.timeout_action!r}")


CANARY, STABLE = tw.CANARY, tw.STABLE
REWARD, ERRORS, LATENCY = 0, 1, 2  # rows of the metric axis, in the order of METRICS


class Arms:
    """The seven confidence sequences of a canary comparison, each at level alpha / 7: one ``ConfidenceSequence`` of
    shape ``(2 arms, 3 metrics, *shape)`` (one numpy update per trajectory, also when ``shape`` holds thousands of
    simulated rollouts), and ``paired``, the reward difference over pairs of rewards (see the module docstring;
    ``paired=False``: six sequences at alpha / 6, for comparison). Latency values are latency / latency_cap_s."""

    def __init__(self, alpha: float, shape: tuple[int, ...] = (), *, paired: bool = True):
        self.shape = tuple(shape)
        level = alpha / (SEQUENCES_PER_ROLLOUT if paired else SEQUENCES_PER_ROLLOUT - 1)
        self.cs = ConfidenceSequence(level, (2, len(METRICS), *self.shape))
        self.paired = ConfidenceSequence(level, self.shape) if paired else None  # None: the comparison without it
        streams = int(np.prod(self.shape, dtype=int)) if paired else 0
        self._waiting = np.zeros((2, PAIRING_BUFFER, streams))  # per arm, a ring of rewards not yet paired
        self._head = np.zeros((2, streams), dtype=int)
        self._count = np.zeros((2, streams), dtype=int)

    def samples(self, arm: int):
        """Trajectories counted for ``arm`` (CANARY or STABLE)."""
        return self.cs.n[arm, ERRORS]

    def rewarded(self, arm: int):
        return self.cs.n[arm, REWARD]

    def mean(self, arm: int, metric: int):
        return self.cs.mean[arm, metric]

    def add(self, arm: int, reward, error_rate, latency_norm) -> None:
        """One trajectory for ``arm`` (scalar use); ``reward`` None: it carries no reward."""
        x = np.zeros((2, len(METRICS)))
        mask = np.zeros((2, len(METRICS)), dtype=bool)
        x[arm] = (0.0 if reward is None else reward, error_rate, latency_norm)
        mask[arm] = (reward is not None, True, True)
        self.add_many(x, mask)

    def add_reward(self, arm: int, reward: float) -> None:
        """A reward that arrived after its trajectory was counted (feedback joined later)."""
        x = np.zeros((2, len(METRICS)))
        mask = np.zeros((2, len(METRICS)), dtype=bool)
        x[arm, REWARD], mask[arm, REWARD] = reward, True
        self.add_many(x, mask)

    def add_many(self, x, mask) -> None:
        """Vectorised: ``x`` and ``mask`` of shape (2, 3, *shape)."""
        self.cs.update(x, mask)
        if self.paired is not None:
            self._pair(np.asarray(x, dtype=float)[:, REWARD], np.asarray(mask, dtype=bool)[:, REWARD])

    def _pair(self, reward, mask) -> None:
        """Queue each arm's new rewards (at most one per arm and stream), then pair the oldest waiting reward of
        each arm wherever both have one."""
        reward = np.clip(reward.reshape(2, -1), 0.0, 1.0)
        mask = mask.reshape(2, -1)
        streams = np.arange(reward.shape[1])
        for arm in (CANARY, STABLE):
            full = mask[arm] & (self._count[arm] == PAIRING_BUFFER)  # drop the oldest: no value is looked at
            self._head[arm] = (self._head[arm] + full) % PAIRING_BUFFER
            slot = (self._head[arm] + self._count[arm] - full) % PAIRING_BUFFER
            self._waiting[arm, slot[mask[arm]], streams[mask[arm]]] = reward[arm, mask[arm]]
            self._count[arm] += mask[arm] & ~full
        both = (self._count[CANARY] > 0) & (self._count[STABLE] > 0)
        if both.any():
            first = self._waiting[np.arange(2)[:, None], self._head, streams]  # [arm, stream], CANARY row first
            self.paired.update(((first[CANARY] - first[STABLE] + 1) / 2).reshape(self.shape), both.reshape(self.shape))
            self._head = (self._head + both) % PAIRING_BUFFER
            self._count -= both

    def reward_difference(self):
        """Bounds on mu_c - mu_s: the per-arm sequences' difference, intersected with the paired sequence's."""
        lo, hi = self.cs.lower, self.cs.upper
        bounds = (lo[CANARY, REWARD] - hi[STABLE, REWARD], hi[CANARY, REWARD] - lo[STABLE, REWARD])
        if self.paired is None:
            return bounds
        return np.maximum(bounds[0], 2 * self.paired.lower - 1), np.minimum(bounds[1], 2 * self.paired.upper - 1)


@dataclass(frozen=True)
class Comparison:
    metric: str  # one of METRICS, or "tripwire:<name>"
    lower: float
    upper: float
    margin: float
    verdict: str  # "better" | "non_inferior" | "worse" | "undecided" | TRIPPED


@dataclass(frozen=True)
class Decision:
    action: str  # "hold" | "promote" | "rollback"
    reason: str
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)
    timed_out: bool = False


def _bounds(arms: Arms, policy: Policy) -> dict[str, tuple]:
    lo, hi = arms.cs.lower, arms.cs.upper
    ratio = policy.latency_ratio
    return {
        "reward": arms.reward_difference(),
        "error_rate": (lo[CANARY, ERRORS] - hi[STABLE, ERRORS], hi[CANARY, ERRORS] - lo[STABLE, ERRORS]),
        "latency": (lo[CANARY, LATENCY] - ratio * hi[STABLE, LATENCY],
                    hi[CANARY, LATENCY] - ratio * lo[STABLE, LATENCY]),
    }


def _verdicts(bounds: dict[str, tuple], policy: Policy) -> dict[str, tuple]:
    """Per metric (worse, passes) boolean (arrays)."""
    r_lo, r_hi = bounds["reward"]
    e_lo, e_hi = bounds["error_rate"]
    l_lo, l_hi = bounds["latency"]
    return {
        "reward": (r_hi < -policy.reward_margin, r_lo > -policy.reward_margin),
        "error_rate": (e_lo > policy.error_margin, e_hi <= policy.error_margin),
        "latency": (l_lo > 0, l_hi <= 0),
    }


def decide_codes(arms: Arms, policy: Policy, step_samples, step_elapsed_s, trips: tw.Tripwires | None = None):
    """``(code, timed_out)`` elementwise: code HOLD, PROMOTE (next step) or ROLLBACK.

    ``step_samples``: canary trajectories since the current step began; ``step_elapsed_s``: its age in seconds;
    ``trips``: the rollout's tripwire counts (None: no tripwires), any of which firing rolls back.
    """
    m = policy.min_samples
    counted = (arms.samples(CANARY) >= m) & (arms.samples(STABLE) >= m)
    rewarded = (arms.rewarded(CANARY) >= m) & (arms.rewarded(STABLE) >= m)
    verdicts = _verdicts(_bounds(arms, policy), policy)
    worse = (rewarded & verdicts["reward"][0]) | (counted & (verdicts["error_rate"][0] | verdicts["latency"][0]))
    if trips is not None:
        worse = worse | tw.tripped(trips, policy.tripwires).any(axis=0)
    passes = (rewarded & counted & (np.asarray(step_samples) >= m)
              & verdicts["reward"][1] & verdicts["error_rate"][1] & verdicts["latency"][1])
    code = np.where(worse, ROLLBACK, np.where(passes, PROMOTE, HOLD))
    timed_out = (code == HOLD) & (np.asarray(step_elapsed_s) >= policy.timeout_s)
    fallback = ROLLBACK if policy.timeout_action == "rollback" else PROMOTE
    return np.where(timed_out, fallback, code), timed_out


def compare(arms: Arms, policy: Policy) -> tuple[Comparison, ...]:
    """The evidence per metric (scalar arms). Latency bounds are in seconds."""
    bounds = _bounds(arms, policy)
    verdicts = _verdicts(bounds, policy)
    margins = {"reward": policy.reward_margin, "error_rate": policy.error_margin, "latency": policy.latency_ratio}
    scale = {"reward": 1.0, "error_rate": 1.0, "latency": policy.latency_cap_s}
    out = []
    for metric in METRICS:
        lo, hi = (float(v) * scale[metric] for v in bounds[metric])
        worse, passes = (bool(v) for v in verdicts[metric])
        better = lo > 0 if metric == "reward" else hi < 0
        verdict = "worse" if worse else ("better" if better else "non_inferior") if passes else "undecided"
        out.append(Comparison(metric, lo, hi, margins[metric], verdict))
    return tuple(out)


def decide(arms: Arms, policy: Policy, *, step_samples: int, step_elapsed_s: float,
           trips: tw.Tripwires | None = None) -> Decision:
    code, timed_out = decide_codes(arms, policy, step_samples, step_elapsed_s, trips)
    code, timed_out = int(code), bool(timed_out)
    comparisons = compare(arms, policy)
    fired = tw.check(trips, policy.tripwires) if trips is not None else ()
    if fired:
        return Decision("rollback", "; ".join(t.reason for t in fired), comparisons + tuple(
            Comparison(f"tripwire:{t.tripwire}", t.value, t.value, t.bound, TRIPPED) for t in fired))
    n_canary, n_stable = int(arms.samples(CANARY)), int(arms.samples(STABLE))
    r_canary, r_stable = int(arms.rewarded(CANARY)), int(arms.rewarded(STABLE))
    m = policy.min_samples
    if timed_out:
        return Decision("rollback" if code == ROLLBACK else "promote",
                        f"no decision after {step_elapsed_s:.0f} s (timeout_s {policy.timeout_s:g}); "
                        f"default action {policy.timeout_action}", comparisons, timed_out=True)
    if code == ROLLBACK:
        worse = [c for c in comparisons if c.verdict == "worse"]
        return Decision("rollback", "; ".join(_worse_text(c) for c in worse), comparisons)
    if code == PROMOTE:
        return Decision("promote", "not worse on reward, errors and latency: " + ", ".join(
            f"{c.metric} {c.verdict}" for c in comparisons), comparisons)
    if n_canary < m or n_stable < m:
        why = f"waiting for {m} trajectories per arm (canary {n_canary}, stable {n_stable})"
    elif r_canary < m or r_stable < m:
        why = f"waiting for {m} rewarded trajectories per arm (canary {r_canary}, stable {r_stable})"
    elif step_samples < m:
        why = f"waiting for {m} canary trajectories in this step ({step_samples})"
    else:
        why = "undecided: " + ", ".join(f"{c.metric} {c.verdict}" for c in comparisons
                                        if c.verdict == "undecided")
    return Decision("hold", why, comparisons)


def _worse_text(c: Comparison) -> str:
    if c.metric == "reward":
        return f"reward lower by more than {c.margin:g} (difference at most {c.upper:+.3f})"
    if c.metric == "error_rate":
        return f"more tool errors by more than {c.margin:g} (difference at least {c.lower:+.3f})"
    return f"slower than {c.margin:g}x the stable latency (excess at least {c.lower:+.2f} s)"
