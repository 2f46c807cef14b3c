"""`agentflow drive`: training rollouts through the gateway that serves traffic (docs/training.md).

Each training query is sent G times with one group id, ``source="training"``, its ground truth and the sampling
temperature, through the same gateway / ring / LLM server as production queries; the memory service emits the
trajectories, and the trainer (`agentflow train`) groups them by group id. ``evaluate`` is the held-out check the
learning bench and the demo use: greedy, ``source="eval"``, scored here.

``--from-traffic`` replays production queries instead of a dataset (docs/rewards.md): ``TrafficPool`` follows the
``trajectories`` topic and keeps the most recent distinct queries (by normalised text) of ``traffic`` records that
may be trained on (``train_ok``); a query text ever seen opted out is never replayed. The least replayed go first;
among those, rated ones, then the most recent. A replay group has no ground truth unless the production query had
one: its rewards come from the vote, the feedback ledger, a judge (the trainer's reward sources).
"""

from __future__ import annotations

import json
import random
import re
from collections import OrderedDict
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from agentflow import cli_args
from agentflow.collectors import default_registry, process_collectors
from agentflow.config import setting
from agentflow.domain.convert import record_from_proto
from agentflow.errors import InvalidInput
from agentflow.rewards import kind_names, score
from agentflow.trainer.branching import BranchPool
from agentflow.trainer.gateway_client import Gateway

if TYPE_CHECKING:
    from agentflow.trainer.pace import TrainerPace

BUSY_BACKOFF_S = 1.0  # a rollout refused by a full (or not yet ready) gateway waits this long before its slot frees


def _dataset(text: str) -> str:
    """--dataset: synthetic[:SEED], or a JSONL file."""
    return text if re.fullmatch(r"synthetic(:-?\d+)?", text) else str(cli_args.jsonl_file(text))


@dataclass(frozen=True)
class DriveSettings:
    """`agentflow drive` settings; each is also AGENTFLOW_DRIVE_<NAME>."""

    gateway: str = setting("127.0.0.1:50051", "the gateway's gRPC address", cli_args.address, group="gateway")
    dataset: str = setting("synthetic", "'synthetic[:SEED]' (its train split) or a JSONL file of "
                                        "{query|question, answer}", _dataset, group="queries")
    group_size: int = setting(8, "G: rollouts per query, sharing a group id", cli_args.integer(1), group="rollouts")
    rate: float = setting(0.0, "groups started per second (0: as fast as the concurrency allows)", cli_args.number(0),
                          group="pace")
    concurrency: int = setting(16, "queries in flight at once", cli_args.integer(1), group="pace")
    temperature: float = setting(1.0, "planner sampling temperature of the rollouts", cli_args.number(0),
                                 group="rollouts")
    max_steps: int = setting(3, "planner turns per rollout", cli_args.integer(1), group="rollouts")
    max_time_s: float = setting(60.0, "deadline of one rollout", cli_args.number(0, lo_open=True), group="rollouts")
    groups: int = setting(0, "stop after this many groups (0: until stopped)", cli_args.integer(0), group="pace")
    seed: int = setting(0, "order of the queries", group="queries")
    api_key: str = setting("", "the gateway's API key, if it needs one", cli_args.text(), group="gateway")
    reward_kind: str = setting("math", "rule used to score answers for the progress display",
                               cli_args.names(kind_names, one=True), group="progress and metrics")
    planner_version: str = setting("", "pin the rollouts to a served version: 'latest' keeps them on-policy while a "
                                       "rollout controller splits traffic (empty: the server's weights decide)",
                                   cli_args.text(), group="gateway")
    branch_share: float = setting(0.0, "share of the groups that are shadow branches: G continuations of one of this "
                                       "run's finished rollouts from its state after a random turn (docs/training.md, "
                                       "Shadow branches; 0: none)", cli_args.number(0, 1, hi_open=True),
                                  group="rollouts")
    from_traffic: bool = setting(False, "replay recent production queries (train_ok traffic on the trajectories "
                                        "topic) instead of the dataset", group="queries")
    traffic_window: int = setting(5000, "with from_traffic: distinct recent queries kept to replay",
                                 cli_args.integer(1), group="queries")
    max_ahead_groups: int = setting(0, "start a group only while fewer than this many sent groups are not yet "
                                       "finished by the trainer (trained on or dropped, as trainer.progress says); "
                                       "(max_staleness + 1) x the trainer's groups per step keeps rollouts within "
                                       "max_staleness versions (0: no bound; docs/training.md)",
                                    cli_args.integer(0), group="pace")
    bootstrap: str = setting("", "with from_traffic or max_ahead_groups: Kafka bootstrap servers (default "
                                 "AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)", cli_args.addresses, group="queries")
    metrics_port: int = setting(-1, "serve Prometheus /metrics on this port (-1: off, 0: any free port)",
                               cli_args.port(off=True), group="progress and metrics")
    metrics_host: str = setting("127.0.0.1", "address of the metrics endpoint (0.0.0.0 in a pod)",
                               cli_args.text(), group="progress and metrics")

    def __post_init__(self):
        if self.group_size < 1 or self.concurrency < 1 or self.max_steps < 1:
            raise InvalidInput("drive group_size, concurrency and max_steps must be >= 1")
        if not 0 <= self.branch_share < 1:
            raise InvalidInput(f"drive branch_share must be in [0, 1), got {self.branch_share}")
        if self.rate < 0 or self.max_time_s <= 0 or self.traffic_window < 1 or self.max_ahead_groups < 0:
            raise InvalidInput("drive rate must be >= 0, max_time_s > 0, traffic_window >= 1 and max_ahead_groups "
                               ">= 0")
        if not -1 <= self.metrics_port <= 65535:
            raise InvalidInput(f"drive metrics_port must be -1 (off), 0 (any free port) or a port, got "
                               f"{self.metrics_port}")


@dataclass(frozen=True)
class Item:
    query: str
    answer: str
    id: str = ""


def load_dataset(spec: str, split: str = "train") -> list[Item]:
    """``synthetic[:SEED]`` (the environment's ``split``) or a JSONL file with ``query``/``question`` and ``answer``."""
    from agentflow.envs.synthetic import environment_from_spec

    if spec.startswith("synthetic"):
        env = environment_from_spec(spec)
        return [Item(t.query, t.answer, t.id) for t in (env.train if split == "train" else env.heldout)]
    path = Path(spec)
    if not path.is_file():
        raise InvalidInput(f"dataset {spec!r} is neither 'synthetic[:SEED]' nor a JSONL file")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append(Item(str(row.get("query") or row["question"]), str(row["answer"]), str(row.get("id", n))))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidInput(f"{path}:{n}: expected an object with query (or question) and answer: {e}") from None
    if not items:
        raise InvalidInput(f"dataset {path} is empty")
    return items


def _rewarded(response, answer: str, kind: str) -> float:
    return float(score(kind, response.answer, {"answer": answer})["value"])


class DriveMetrics:
    """The counts ``Stats`` keeps, as Prometheus counters (``agentflow drive --metrics-port``)."""

    def __init__(self, registry=None):
        from prometheus_client import Counter, Gauge

        registry = default_registry(registry)
        self.sent = Counter("agentflow_drive_rollouts_sent", "Training rollouts sent to the gateway",
                            registry=registry)
        self.answered = Counter("agentflow_drive_rollouts_answered", "Training rollouts the gateway answered",
                                registry=registry)
        self.failed = Counter("agentflow_drive_rollouts_failed", "Training rollouts that failed, by error (the "
                              "gRPC status code, or 'status error' for an answer with status error)", ["error"],
                              registry=registry)
        self.groups = Counter("agentflow_drive_groups", "Groups started (group_size rollouts sharing a group id)",
                              registry=registry)
        self.ahead = Gauge("agentflow_drive_groups_ahead", "Groups sent and not yet finished by the trainer (with "
                           "max_ahead_groups; the driver waits at that limit)", registry=registry)


def drive_metrics() -> DriveMetrics:
    return process_collectors(DriveMetrics)


class Stats:
    def __init__(self, metrics: DriveMetrics | None = None):
        self.lock = threading.Lock()
        self.sent = self.answered = self.failed = 0
        self.rewards: list[float] = []
        self.errors: dict[str, int] = {}
        self.metrics = metrics

    def started(self, first_of_group: bool) -> None:
        with self.lock:
            self.sent += 1
        if self.metrics is not None:
            self.metrics.sent.inc()
            if first_of_group:
                self.metrics.groups.inc()

    def done(self, reward: float | None, error: str = "") -> None:
        with self.lock:
            if error:
                self.failed += 1
                self.errors[error] = self.errors.get(error, 0) + 1
            else:
                self.answered += 1
                if reward is not None:  # a replayed query without ground truth has none here
                    self.rewards.append(reward)
        if self.metrics is not None:
            if error:
                self.metrics.failed.labels(error).inc()
            else:
                self.metrics.answered.inc()

    def line(self, started: float) -> dict:
        with self.lock:
            recent = self.rewards[-200:]
            return {"t_s": round(time.monotonic() - started, 1), "sent": self.sent, "answered": self.answered,
                    "failed": self.failed, "reward_recent": round(sum(recent) / len(recent), 3) if recent else None,
                    "answers_per_s": round(self.answered / max(time.monotonic() - started, 1e-9), 2),
                    "errors": dict(self.errors)}


def rollout_groups(items: Sequence[Item], group_size: int, seed: int) -> Iterator[tuple[Item, str]]:
    """Endless (item, group id) pairs, each group's G copies together, in shuffled passes over the items."""
    rng = random.Random(seed)
    while True:
        order = list(items)
        rng.shuffle(order)
        for item in order:
            group = f"{item.id or 'q'}/{uuid.uuid4().hex[:10]}"
            for _ in range(group_size):
                yield item, group


@dataclass
class _Replay:
    item: Item
    rated: bool = False
    replays: int = 0


class TrafficPool:
    """The production queries ``--from-traffic`` replays (see the module docstring). Thread-safe."""

    def __init__(self, window: int = 5000, max_opted_out: int = 100_000):
        self.window, self.max_opted_out = window, max_opted_out
        self._queries: OrderedDict[str, _Replay] = OrderedDict()  # normalised text -> replay, oldest first
        self._opted_out: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.seen = self.refused = 0

    def add(self, record: dict) -> None:
        from agentflow.domain.trajectory import Record
        from agentflow.rewards.text import normalise_answer

        if record.get("source") != "traffic":
            return
        key = normalise_answer(record.get("query", ""))
        with self._lock:
            self.seen += 1
            if not record.get("train_ok"):
                self.refused += 1
                self._queries.pop(key, None)
                self._opted_out[key] = None
                while len(self._opted_out) > self.max_opted_out:
                    self._opted_out.popitem(last=False)
                return
            if not key or key in self._opted_out:
                return
            entry = self._queries.pop(key, None) or _Replay(Item(record["query"], record.get("ground_truth", ""),
                                                                 record.get("trajectory_id", "")))
            entry.rated = entry.rated or bool(Record(record).rewards("human"))
            self._queries[key] = entry  # the most recent last
            while len(self._queries) > self.window:
                self._queries.popitem(last=False)

    def take(self) -> Item | None:
        """The next query to replay: the least replayed; among those rated ones, then the most recent. None when
        the pool is empty."""
        with self._lock:
            if not self._queries:
                return None
            recency = {key: n for n, key in enumerate(self._queries)}
            key = min(self._queries, key=lambda k: (self._queries[k].replays, not self._queries[k].rated, -recency[k]))
            entry = self._queries[key]
            entry.replays += 1
            return entry.item

    def __len__(self) -> int:
        with self._lock:
            return len(self._queries)


def traffic_groups(pool: TrafficPool, group_size: int, stop: threading.Event) -> Iterator[tuple[Item, str]]:
    """Endless (item, group id) pairs from ``pool``, waiting while it is empty."""
    while not stop.is_set():
        item = pool.take()
        if item is None:
            stop.wait(0.5)
            continue
        group = f"replay/{uuid.uuid4().hex[:12]}"
        for _ in range(group_size):
            yield item, group


Branch = tuple[str, int]  # (trajectory id, turn): SolveRequest.branch


def with_branches(groups: Iterator[tuple[Item, str]], pool: BranchPool, share: float,
                  group_size: int) -> Iterator[tuple[Item, str, Branch | None]]:
    """``groups`` as (item, group id, branch) with shadow branch groups mixed in: before a group, one from ``pool``
    while branch groups are fewer than ``share`` of the groups so far (none while the pool is empty)."""
    sent = branched = 0
    for n, (item, group) in enumerate(groups):
        if n % group_size == 0:
            if share and branched < share * (sent + 1) and (point := pool.take()) is not None:
                branched += 1
                sent += 1
                for _ in range(group_size):
                    yield Item(point.query, point.ground_truth), point.group_id, (point.trajectory_id, point.turn)
            sent += 1
        yield item, group, None


def drive_bus(settings: DriveSettings):
    """The Kafka that ``from_traffic`` and ``max_ahead_groups`` read: AGENTFLOW_KAFKA_*, with ``bootstrap`` on top."""
    from dataclasses import replace

    from agentflow.bus.config import BusConfig

    bus = BusConfig.from_env()
    return replace(bus, bootstrap_servers=settings.bootstrap) if settings.bootstrap else bus


def follow_traffic(settings: DriveSettings, pool: TrafficPool, stop: threading.Event):
    """A started ``Follower`` of ``trajectories`` that feeds ``pool``."""
    from agentflow.bus import topics
    from agentflow.bus.clients import Follower
    from agentflow.bus.codec import DecodeError, decode

    bus = drive_bus(settings)

    def handle(received) -> None:
        try:
            envelope = decode(received.value)
        except DecodeError:
            return
        if envelope.WhichOneof("payload") == "trajectory" and envelope.trajectory.source == "traffic":
            pool.add(record_from_proto(envelope.trajectory))

    return Follower(bus, [topics.TRAJECTORIES], handle, stop=stop, name="drive-traffic").start()


def drive(settings: DriveSettings, *, stop: threading.Event | None = None, progress=print,
          progress_every_s: float = 10.0) -> dict:
    """Send rollouts until ``settings.groups`` groups were sent or ``stop`` is set; returns the final stats."""
    import grpc

    stop = stop or threading.Event()
    metrics = None
    if settings.metrics_port >= 0:
        from agentflow import telemetry

        metrics = drive_metrics()
        port = telemetry.serve_metrics(settings.metrics_port, settings.metrics_host)
        progress(json.dumps({"event": "drive_metrics", "url": f"http://{settings.metrics_host}:{port}/metrics"}))
    follower_stop = threading.Event()  # the followers stop once the rollouts in flight are done
    if settings.from_traffic:
        pool = TrafficPool(settings.traffic_window)
        follow_traffic(settings, pool, follower_stop)
        groups = traffic_groups(pool, settings.group_size, stop)
    else:
        groups = rollout_groups(load_dataset(settings.dataset), settings.group_size, settings.seed)
    pace = None
    if settings.max_ahead_groups:
        from agentflow.trainer.pace import TrainerPace, follow_progress

        pace = TrainerPace(settings.max_ahead_groups)
        follow_progress(drive_bus(settings), pace, follower_stop)
    branches = BranchPool(seed=settings.seed)
    rollouts = with_branches(groups, branches, settings.branch_share, settings.group_size)
    gateway = Gateway(settings.gateway, settings.api_key)
    stats, started = Stats(metrics), time.monotonic()
    slots = threading.Semaphore(settings.concurrency)

    def one(item: Item, group: str, branch: Branch | None) -> None:
        try:
            response = gateway.solve(item.query, answer=item.answer, group_id=group, source="training",
                                     temperature=settings.temperature, max_steps=settings.max_steps,
                                     max_time_s=settings.max_time_s, planner_version=settings.planner_version,
                                     branch=branch)
            stats.done(_rewarded(response, item.answer, settings.reward_kind) if item.answer else None,
                       "" if response.status != "error" else "status error")
            if settings.branch_share and branch is None:
                branches.add(record_from_proto(response.trajectory))
        except grpc.RpcError as e:
            stats.done(None, e.code().name)
            if e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                stop.wait(BUSY_BACKOFF_S)  # the gateway is full or not ready: do not hammer it
        finally:
            slots.release()

    last_report, groups_sent, branch_groups = started, 0, 0
    with ThreadPoolExecutor(settings.concurrency) as pool:
        for n, (item, group, branch) in enumerate(rollouts):
            if n % settings.group_size == 0:
                if stop.is_set() or (settings.groups and groups_sent >= settings.groups):
                    break
                if pace is not None and not _wait_for_trainer(pace, stop, metrics, lambda: progress(json.dumps(
                        {"event": "drive", "waiting": "trainer", "ahead": pace.ahead, **stats.line(started)})),
                        progress_every_s):
                    break
                groups_sent += 1
                branch_groups += branch is not None
                if settings.rate:
                    time.sleep(max(0.0, started + groups_sent / settings.rate - time.monotonic()))
            while not slots.acquire(timeout=0.5):
                if stop.is_set():
                    break
            else:
                stats.started(first_of_group=n % settings.group_size == 0)
                if pace is not None and n % settings.group_size == 0:
                    pace.started_group()
                pool.submit(one, item, group, branch)
            if time.monotonic() - last_report >= progress_every_s:
                last_report = time.monotonic()
                progress(json.dumps({"event": "drive", **stats.line(started)}))
    gateway.close()
    follower_stop.set()
    final = {"event": "drive_done", "groups": groups_sent, "branch_groups": branch_groups, **stats.line(started)}
    progress(json.dumps(final))
    return final


def _wait_for_trainer(pace: TrainerPace, stop: threading.Event, metrics: DriveMetrics | None, report,
                      report_every_s: float) -> bool:
    """Wait until ``pace`` lets a group start (True), reporting every ``report_every_s``; False when stopped."""
    waited_since = time.monotonic()
    while not stop.is_set():
        if metrics is not None:
            metrics.ahead.set(pace.ahead)
        if pace.wait(0.5):
            return True
        if time.monotonic() - waited_since >= report_every_s:
            waited_since = time.monotonic()
            report()
    return False


def evaluate(gateway: Gateway, items: Sequence[Item], *, max_steps: int = 3, max_time_s: float = 60.0,
             concurrency: int = 16, reward_kind: str = "math", planner_version: str = "") -> dict:
    """Greedy success on ``items`` through the gateway (``source="eval"``: the trainer ignores these), optionally
    of one pinned version."""
    import grpc

    def one(item: Item) -> tuple[float, str, str]:
        """(reward, the tools used, error)"""
        try:
            response = gateway.solve(item.query, answer=item.answer, source="eval", temperature=0.0,
                                     max_steps=max_steps, max_time_s=max_time_s, planner_version=planner_version)
        except grpc.RpcError as e:
            return 0.0, "", e.code().name
        turns = response.trajectory.turns
        if response.status == "error" or not any(t.planner.model_version for t in turns):
            # no planner call answered (e.g. the pinned version is no longer served): not an answer to score
            return 0.0, "", response.error or next((t.parse_error for t in turns if t.parse_error), "no planner")
        tools = ",".join(t.decision.tool for t in response.trajectory.turns) or "-"
        return _rewarded(response, item.answer, reward_kind), tools, ""

    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, items))
    return {"success": sum(r for r, _, _ in results) / max(len(results), 1), "n": len(results),
            "failed": sum(1 for _, _, error in results if error),
            "tool_sequences": _counts(tools for _, tools, error in results if not error)}


def _counts(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])
