"""The benches' in-process harness: rollouts through the real loop on an embedded engine, and the loop around
``Trainer.step`` (docs/training.md, "The in-process driver").

``InProcessRollouts`` samples G trajectories per training query with the real loop (``Agent.solve``) on an
``EmbeddedEngine`` whose weights are the planner being trained (copied in by ``sync`` after every step, with the
new version as the engine's version string, so every record says which policy produced it), under a profile
(``tiny-deterministic`` by default) for the frozen modules. ``train`` repeats fetch -> ``Trainer.step``;
``task_batches`` and ``tool_stats`` feed and read it.

Benches import it as ``_harness`` (their folder is on ``sys.path``), tests as ``bench._harness``.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Callable, Sequence

import torch

from agentflow.domain.trajectory import Record
from agentflow.errors import InvalidInput
from agentflow.tools.base import ToolResult
from agentflow.rewards import score_records
from agentflow.trainer.loop import Trainer


class MemoTool:
    """A tool whose results are memoised by command: for deterministic tools only (the profile's python programs
    are pure arithmetic). Saves the sandbox's process start (~0.1 s) when a group repeats a command."""

    def __init__(self, inner):
        self.inner, self.spec = inner, inner.spec
        self._cache: dict[str, ToolResult] = {}
        self.hits = self.misses = 0

    def run(self, command: str, timeout: float) -> ToolResult:
        cached = self._cache.get(command)
        if cached is not None:
            self.hits += 1
            return ToolResult(output=cached.output, error=cached.error, duration_s=0.0, meta=dict(cached.meta))
        self.misses += 1
        result = self.inner.run(command, timeout)
        if not result.error.startswith(("timeout", "unavailable")):  # only outcomes of the program itself
            self._cache[command] = result
        return result


class InProcessRollouts:
    """G trajectories per query through the real loop, planner on an EmbeddedEngine, frozen modules by profile."""

    def __init__(self, engine, tools: Sequence[str], *, profile: str = "tiny-deterministic", tools_config=None,
                 max_turns: int = 3, eval_max_turns: int = 3, temperature: float = 1.0, reward_kind: str = "math",
                 memoise: Sequence[str] = ("python",), max_time_s: float = 120.0, compact_prompt: bool = True,
                 turn_cost: float = 0.0, knowledge: Sequence[str] = (), noise=None):
        from agentflow.flow.loop import LoopConfig
        from agentflow.envs.profiles import get_profile

        self.engine, self.profile, self.reward_kind = engine, get_profile(profile), reward_kind
        self.turn_cost = turn_cost  # training rewards only: evaluation always scores the outcome alone

        def agent(turns: int, temp: float):
            return self.profile.build_agent(engine, tools, LoopConfig(max_steps=turns, max_time_s=max_time_s),
                                            planner_temperature=temp, tools_config=tools_config,
                                            compact=compact_prompt, knowledge=knowledge, noise=noise)

        self.train_agent = agent(max_turns, temperature)
        self.eval_agent = agent(eval_max_turns, 0.0)
        for name in memoise:  # one cache shared by both agents
            if name in self.train_agent.executor.tools:
                memo = MemoTool(self.train_agent.executor.tools[name])
                self.train_agent.executor.tools[name] = memo
                self.eval_agent.executor.tools[name] = memo

    def sync(self, model, version: int) -> None:
        """Put the trained weights (a model, or ``Trainer.serving_weights()``) into the engine and name the version
        its completions report."""
        with torch.no_grad():
            self.engine.model.load_state_dict(model if isinstance(model, dict) else model.state_dict())
        self.engine.version = f"v{version}"

    def collect(self, tasks: Sequence, group_size: int, *, source: str = "training") -> list[dict]:
        """``group_size`` scored trajectories per task (``task.query``, ``task.answer``, ``task.id``)."""
        records = [record for task in tasks
                   for record in self._group(task.query, task.answer, task.id, group_size, source)]
        return score_records(records, self.reward_kind, turn_cost=self.turn_cost)

    def collect_branches(self, points: Sequence, group_size: int) -> list[dict]:
        """``group_size`` scored continuations of each branch point (``trainer.branching.BranchPoint``), one group
        per point: the turn-level groups of issue 35."""
        records = [record for point in points for record in self._group(
            point.query, point.ground_truth, point.group_id, group_size, "training", start=point.state)]
        return score_records(records, self.reward_kind, turn_cost=self.turn_cost)

    def _group(self, query: str, ground_truth: str, name: str, size: int, source: str, start=None) -> list[dict]:
        """``size`` unscored trajectories of one new group (``name`` and a fresh suffix), from ``start`` if given."""
        group = f"{name}/{uuid.uuid4().hex[:8]}"
        return [self.train_agent.solve(query, ground_truth=ground_truth, source=source, group_id=group, start=start)
                for _ in range(size)]

    def evaluate(self, tasks: Sequence) -> dict:
        """Greedy (temperature 0) success on ``tasks``: overall, per kind, and how often the tool sequence was the
        expected one (``task.tools``). Each task's trajectory id is fixed (``eval-<task id>``), so the draws of a
        noisy environment (``profiles.Noise``) are the same at every evaluation."""
        by_kind: dict[str, list[float]] = {}
        exact_tools, turns = 0, 0
        for task in tasks:
            solved = self.eval_agent.solve(task.query, ground_truth=task.answer, source="eval",
                                           trajectory_id=f"eval-{task.id}")
            record = score_records([solved], self.reward_kind)[0]
            view = Record(record)
            by_kind.setdefault(task.kind, []).append(view.reward() or 0.0)  # unscored counts as a failure
            exact_tools += tuple(view.tools()) == tuple(task.tools)
            turns += len(view.turns)
        values = [v for vs in by_kind.values() for v in vs]
        return {"success": sum(values) / max(len(values), 1),
                "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
                "tool_sequence_match": exact_tools / max(len(tasks), 1), "turns_mean": turns / max(len(tasks), 1)}


def tool_stats(records: Sequence[dict]) -> dict:
    """Share of trajectories that used each tool first, and the mean number of turns: a cheap policy readout."""
    first: dict[str, int] = {}
    for r in records:
        tool = (Record(r).tools() or [""])[0]
        first[tool or "none"] = first.get(tool or "none", 0) + 1
    n = max(len(records), 1)
    return {"first_tool": {k: v / n for k, v in sorted(first.items())},
            "turns_mean": sum(len(Record(r).turns) for r in records) / n}


def task_batches(tasks: Sequence, per_batch: int, seed: int = 0):
    """Endless batches of ``per_batch`` tasks: shuffled passes over ``tasks``."""
    rng = random.Random(seed)
    order: list = []
    while True:
        batch = []
        while len(batch) < per_batch:
            if not order:
                order = list(tasks)
                rng.shuffle(order)
            batch.append(order.pop())
        yield batch


# --- the loop around Trainer.step -----------------------------------------------------------------------------


def train(trainer: Trainer, fetch: Callable[[], list[dict]], *, budget_s: float | None = None,
          max_steps: int | None = None, after_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Repeat ``fetch`` (scored records: an in-process driver, or a consumer) -> ``trainer.step`` -> ``after_step``
    until the wall-clock ``budget_s`` or ``max_steps`` is reached. Returns the per-step metrics."""
    if budget_s is None and max_steps is None:
        raise InvalidInput("train needs budget_s or max_steps")
    started, history = time.monotonic(), []
    while (max_steps is None or len(history) < max_steps) and (budget_s is None
                                                                or time.monotonic() - started < budget_s):
        t0 = time.monotonic()
        records = fetch()
        fetch_s = time.monotonic() - t0
        metrics = trainer.step(records)
        metrics.update(fetch_s=fetch_s, elapsed_s=time.monotonic() - started, records=len(records))
        history.append(metrics)
        if after_step:
            after_step(metrics)
    return history
