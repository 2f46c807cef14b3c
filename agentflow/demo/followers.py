"""What `agentflow demo` follows into its state, one function each: the controller's decisions, the trainer's step
metrics and (--unlabeled) the training queries on the bus. Each runs until ``stop`` in a thread of its own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from agentflow.demo.shared import Shared, pct


def follow_decisions(bootstrap: str, shared: Shared, stop: threading.Event, progress) -> None:
    """The rollout controller's decisions (from the topic's beginning): the versions' roles, the comparisons and the
    decision log; a progress line for each canary, promotion, rollback and rejection."""
    from agentflow.bus import topics
    from agentflow.domain.convert import to_dict

    def handle(received) -> None:
        decision = to_dict(received.envelope().rollout_decision)
        with shared as state:
            record_decision(state, decision, shared.t_s())
        action = decision.get("action", "")
        if action in ("canary", "promote", "rollback", "reject"):
            progress(f"{action} {decision.get('version', '')}: {decision.get('reason', '')[:160]}")

    _follow(bootstrap, topics.ROLLOUT_DECISIONS, handle, stop, "demo-decisions", poll_s=0.5)


def record_decision(state: dict, d: dict, t_s: float) -> None:
    """One decision of the controller into the state (under its lock)."""
    versions, summary = state["versions"], state["summary"]
    action, version = d.get("action", ""), d.get("version", "")
    percent = int(d.get("percent", 0) or 0)
    if action in ("canary", "step"):
        versions.update(canary=version, canary_percent=percent)
    elif action == "promote":
        versions.update(stable=version, canary=None, canary_percent=0)
        summary["promoted"] += 1
    elif action in ("rollback", "reject"):
        versions.update(canary=None, canary_percent=0)
        summary["rolled_back"] += action == "rollback"
    evidence = {k: d.get(k) for k in ("stable_version", "canary", "stable", "comparisons", "step_elapsed_s")}
    canary, stable = d.get("canary") or {}, d.get("stable") or {}
    if canary.get("samples") or stable.get("samples"):
        versions.update(canary_reward=canary.get("reward_mean"), stable_reward=stable.get("reward_mean"),
                        canary_n=int(canary.get("samples", 0)), stable_n=int(stable.get("samples", 0)))
    state["decisions"].append({"t_s": t_s, "version": version, "action": action, "percent": percent,
                               "reason": d.get("reason", ""), "evidence": evidence})


def follow_training_queries(bootstrap: str, shared: Shared, private: set[str], stop: threading.Event) -> None:
    """--unlabeled: count the training rollouts, and those of an opted-out query (there must be none)."""
    from agentflow.bus import topics
    from agentflow.bus.codec import DecodeError, decode

    def handle(received) -> None:
        try:
            envelope = decode(received.value)
        except DecodeError:
            return
        if envelope.WhichOneof("payload") == "query" and envelope.query.source == "training":
            with shared as state:
                state["feedback"]["replayed"] += 1
                state["feedback"]["opted_out_replayed"] += envelope.query.query in private

    _follow(bootstrap, topics.QUERIES, handle, stop, "demo-training-queries")


def _follow(bootstrap: str, topic: str, handle, stop: threading.Event, name: str, poll_s: float = 0.1) -> None:
    """Every record of ``topic``, from its beginning, to ``handle`` until ``stop`` (the bus's one follower loop;
    it waits for a topic that does not exist yet)."""
    from agentflow.bus.clients import Follower
    from agentflow.bus.config import BusConfig

    Follower(BusConfig(bootstrap_servers=bootstrap), [topic], handle, stop=stop, name=name, poll_s=poll_s).run()


def follow_trainer(metrics: Path, shared: Shared, stop: threading.Event) -> None:
    """The trainer's step metrics (``--metrics-file``, one JSON line a step): rewards, the newest trained version,
    and the rollouts' lags and staleness."""
    seen = 0
    while not stop.wait(1.0):
        if not metrics.exists():
            continue
        lines = metrics.read_text().split("\n")[:-1]  # whole lines: the last may still be being written
        for line in lines[seen:]:
            m = json.loads(line)
            with shared as state:
                if "reward" in m and not m.get("skipped"):
                    state["train_reward"].append({"t_s": shared.t_s(), "version": m["version"],
                                                  "reward": m["reward"]})
                state["versions"]["latest_trained"] = f"v{int(m['version']):06d}"
                count_rollouts(state["rollouts"], m)
        seen = len(lines)


def count_rollouts(rollouts: dict, step: dict) -> None:
    """A trainer step's publication-to-first-rollout lags and its trained turns by staleness, into the report."""
    rollouts["version_lags_s"] += step.get("version_lags_s") or []
    rollouts["version_lag_p50_s"] = pct(rollouts["version_lags_s"], 50)
    by_staleness = rollouts["trained_turns_by_staleness"]
    for stale, turns in (step.get("batch_turns_by_staleness") or {}).items():
        by_staleness[str(stale)] = by_staleness.get(str(stale), 0) + turns
