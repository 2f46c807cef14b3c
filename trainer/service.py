"""`agentflow train`: the Flow-GRPO trainer as a consumer of the `trajectories` topic (DESIGN §5; docs/training.md).

::

    trajectories ──> GroupCollector (training records by group id; complete at G, or at the straggler timeout)
                 ──> score (rule reward vs ground truth)
                 ──> Trainer.step (staleness filter, updates, checkpoint)
                 ──> planner.versions (the new version's URI)  ──> commit the offsets the step used

Exactly-once training across crashes: a checkpoint's metadata holds the offsets to resume from (per partition, the
first record not yet used) and the group ids it trained on; a restarted trainer resumes from its newest checkpoint,
seeks each partition to the later of that offset and the committed one, and skips records of groups already
trained. Offsets are committed only after the checkpoint that used them is written, so nothing is lost either.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

from agentflow.bus import topics
from agentflow.bus.clients import Publisher, Received
from agentflow.bus.codec import DecodeError, new_envelope
from agentflow.bus.config import BusConfig
from agentflow.errors import InvalidInput
from agentflow.flow.convert import record_from_proto
from agentflow.proto.v1 import events_pb2
from agentflow.storage import local_copy
from agentflow.trainer.checkpoint import ModelStore, version_name

log = logging.getLogger(__name__)
KEEP_TRAINED_GROUPS = 5000  # group ids remembered in a checkpoint (far more than a step's redelivery window)
VERSIONS_KEY = "planner"  # every planner.versions event has this key: one partition, in order


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainerSettings:
    """`agentflow train` settings; each is also AGENTFLOW_TRAINER_<NAME> (the chart sets them that way)."""

    model_store: str = _f(".agentflow/models", "folder or fsspec URI (s3://bucket/models) of the versioned "
                                               "checkpoints (v000000, v000001, ...)")
    base_model: str = _f("", "the planner to start from when the store is empty: a model folder, its fsspec URI, "
                             "or 'smollm2'")
    group_size: int = _f(8, "G: a group is complete with this many trajectories")
    batch_queries: int = _f(6, "complete groups per training step")
    group_timeout_s: float = _f(120.0, "a group still short of G after this long is used as it is (>= 2 records)")
    learning_rate: float = _f(1e-6, "AdamW learning rate")
    beta: float = _f(0.001, "weight of the k3 KL penalty to the reference planner")
    eps_low: float = _f(0.2, "lower clip range")
    eps_high: float = _f(0.3, "upper clip range")
    updates_per_batch: int = _f(1, "optimizer updates per batch")
    max_staleness: int = _f(4, "drop planner turns sampled more than this many versions before the trained one")
    micro_batch_rows: int = _f(256, "planner turns per forward/backward (gradient accumulation)")
    keep_last: int = _f(0, "checkpoints kept besides v0 and the reference (0: all)")
    reward_kind: str = _f("math", "rule that scores a record against its ground truth (agentflow.rewards)")
    format_warmup_steps: int = _f(0, "before the first update, this many SFT steps that make the tool choice "
                                     "uniform (tiny planners; docs/training.md); 0 = none")
    tools: str = _f("python,search,generalist", "the planner's tools, for the format warm-up")
    objective: str = _f("flow_grpo", "flow_grpo, or an ablation: last_turn, sft_success (docs/training.md)")
    profile: str = _f("", "recorded in every checkpoint's metadata (which profile produced the rollouts)")
    metrics_file: str = _f("", "append each step's metrics as one JSON line to this file")
    max_steps: int = _f(0, "stop after this many steps (0: run until stopped)")
    seed: int = _f(0, "torch seed")

    def __post_init__(self):
        if self.group_size < 2 or self.batch_queries < 1:
            raise InvalidInput("trainer group_size must be >= 2 and batch_queries >= 1")
        if self.group_timeout_s <= 0:
            raise InvalidInput("trainer group_timeout_s must be > 0")


# --- grouping (pure) ---------------------------------------------------------------------------------------------


@dataclass
class _Group:
    first_seen: float
    records: dict = field(default_factory=dict)  # trajectory id -> record (a re-emitted record replaces it)
    positions: list = field(default_factory=list)  # (partition, offset) of every record of the group


class GroupCollector:
    """Training records by group id. A group becomes ready when it has ``group_size`` distinct trajectories or
    its straggler timeout passes (with fewer than 2 it is dropped); ``take`` hands ready groups out;
    ``resume_offsets`` says where a restart must start reading so that no record not yet used is lost."""

    def __init__(self, group_size: int, timeout_s: float, trained: set[str] | None = None):
        self.group_size, self.timeout_s = group_size, timeout_s
        self.trained: set[str] = set(trained or ())
        self.trained_order: list[str] = list(trained or ())
        self.groups: dict[str, _Group] = {}  # collecting
        self.ready: dict[str, _Group] = {}  # complete (or timed out), in the order they became ready
        self.next_offset: dict[int, int] = {}  # partition -> offset after the last record seen
        self.counts = {"records": 0, "ignored": 0, "already_trained": 0, "groups_timed_out": 0, "groups_dropped": 0}

    def add(self, record: dict, partition: int, offset: int, now: float) -> None:
        self.next_offset[partition] = max(self.next_offset.get(partition, 0), offset + 1)
        self.counts["records"] += 1
        gid = record.get("group_id")
        if record.get("source") != "training" or not gid:
            self.counts["ignored"] += 1
            return
        if gid in self.trained:
            self.counts["already_trained"] += 1
            return
        group = self.ready.get(gid) or self.groups.setdefault(gid, _Group(now))
        group.records[record["trajectory_id"]] = record  # a re-emitted record (e.g. feedback joined) replaces it
        group.positions.append((partition, offset))
        if gid in self.groups and len(group.records) >= self.group_size:
            self.ready[gid] = self.groups.pop(gid)

    def ready_count(self, now: float) -> int:
        """Move timed-out groups to ready (or drop them); return how many groups are ready."""
        for gid, group in list(self.groups.items()):
            if now - group.first_seen >= self.timeout_s:
                del self.groups[gid]
                if len(group.records) >= 2:
                    self.counts["groups_timed_out"] += 1
                    self.ready[gid] = group
                else:
                    self.counts["groups_dropped"] += 1
                    self._mark_trained(gid)
        return len(self.ready)

    def take(self, n: int) -> list[list[dict]]:
        """The ``n`` oldest ready groups' records (their ids are remembered as trained)."""
        taken = list(self.ready)[:n]
        out = [list(self.ready.pop(gid).records.values()) for gid in taken]
        for gid in taken:
            self._mark_trained(gid)
        return out

    def _mark_trained(self, gid: str) -> None:
        self.trained.add(gid)
        self.trained_order.append(gid)
        if len(self.trained_order) > 2 * KEEP_TRAINED_GROUPS:
            for old in self.trained_order[:-KEEP_TRAINED_GROUPS]:
                self.trained.discard(old)
            self.trained_order = self.trained_order[-KEEP_TRAINED_GROUPS:]

    def resume_offsets(self) -> dict[int, int]:
        """Per partition: the first offset a restart must read again (the oldest record of a group not handed out
        yet, else the offset after the last record seen)."""
        offsets = dict(self.next_offset)
        for group in [*self.groups.values(), *self.ready.values()]:
            for partition, offset in group.positions:
                offsets[partition] = min(offsets.get(partition, offset), offset)
        return offsets

    def checkpoint_state(self) -> dict:
        return {"consumer_offsets": {str(p): o for p, o in sorted(self.resume_offsets().items())},
                "trained_groups": self.trained_order[-KEEP_TRAINED_GROUPS:]}


# --- the service -------------------------------------------------------------------------------------------------


class TrainerService:
    """The consume -> group -> step -> checkpoint -> announce -> commit loop."""

    def __init__(self, settings: TrainerSettings, bus: BusConfig, *, progress=print):
        from agentflow.trainer.grpo import GRPOConfig
        from agentflow.trainer.loop import TrainConfig, Trainer

        self.settings, self.bus, self.progress = settings, bus, progress
        store = ModelStore(settings.model_store)
        empty = not store.versions()
        if empty and not settings.base_model:
            raise InvalidInput(f"the model store {settings.model_store} is empty: give a base model "
                               "(--base-model or AGENTFLOW_TRAINER_BASE_MODEL)")
        grpo = GRPOConfig(group_size=settings.group_size,
                          batch_trajectories=settings.group_size * settings.batch_queries,
                          lr=settings.learning_rate, beta=settings.beta, eps_low=settings.eps_low,
                          eps_high=settings.eps_high, updates_per_batch=settings.updates_per_batch,
                          max_staleness=settings.max_staleness)
        config = TrainConfig(grpo=grpo, micro_batch_rows=settings.micro_batch_rows,
                             keep_last=settings.keep_last or None, reward_kind=settings.reward_kind,
                             objective=settings.objective)
        base = _base_model(settings.base_model) if empty else settings.base_model  # only an empty store needs it
        self.trainer = Trainer(base, store, config, seed=settings.seed,
                               metadata={"profile": settings.profile, "objective": settings.objective,
                                         "service": "agentflow train"})
        latest = store.get(self.trainer.version).metadata
        self.collector = GroupCollector(settings.group_size, settings.group_timeout_s,
                                        set(latest.get("trained_groups", ())))
        self.resume_from = {int(p): o for p, o in latest.get("consumer_offsets", {}).items()}
        self.stop_event = threading.Event()
        self.steps = 0

    def run(self) -> None:
        topics.ensure_topics(self.bus, [topics.TRAJECTORIES, topics.PLANNER_VERSIONS])
        publisher = Publisher(self.bus, client_id=f"{self.bus.client_id}-trainer")
        if self.trainer.version > self._last_announced():  # e.g. a crash between checkpoint and announcement
            self._announce(publisher, self.trainer.version)
        consumer = self._consumer()
        try:
            while not self.stop_event.is_set():
                batches = consumer.poll(timeout_ms=500)
                now = time.monotonic()
                for batch in batches.values():
                    for r in batch:
                        self._add(Received(r.topic, r.partition, r.offset, r.key, r.value), now)
                if self.collector.ready_count(now) >= self.settings.batch_queries:
                    self._train(self.collector.take(self.settings.batch_queries), publisher)
                    offsets = self.collector.resume_offsets()  # only after the checkpoint that used them
                    consumer.commit({tp: _offset_and_metadata(o) for tp, o in self._partitions(offsets).items()})
                    if self.settings.max_steps and self.steps >= self.settings.max_steps:
                        break
        finally:
            consumer.close(autocommit=False)
            publisher.close(timeout_s=5)

    def _last_announced(self) -> int:
        """The newest version on ``planner.versions`` (-1 when none)."""
        from agentflow.bus.clients import TopicReader
        from agentflow.llm.follow import newest_announcement

        with TopicReader(self.bus, topics.PLANNER_VERSIONS, timeout_s=30) as reader:
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < 1.0:
                if reader.poll(0.2):
                    quiet_since = time.monotonic()
            newest = newest_announcement(reader.records)
        return newest[0] if newest else -1

    def _consumer(self):
        """Every partition of ``trajectories``, assigned (the trainer is a single instance; no group rebalances),
        each positioned at the later of its committed offset and the newest checkpoint's resume offset."""
        from kafka import KafkaConsumer

        options = {**self.bus.consumer_options(self.bus.group_id or "trainer"), "max_poll_records": 500,
                   "client_id": f"{self.bus.client_id}-trainer"}
        consumer = KafkaConsumer(**options)
        name = self.bus.topic(topics.TRAJECTORIES)
        deadline = time.monotonic() + 30
        while not (partitions := consumer.partitions_for_topic(name)):
            if time.monotonic() > deadline:
                consumer.close()
                raise InvalidInput(f"topic {name} does not exist")
            time.sleep(0.1)
        assigned = list(self._partitions({p: 0 for p in sorted(partitions)}))
        consumer.assign(assigned)
        for tp in assigned:
            committed = consumer.committed(tp)
            start = max(committed or 0, self.resume_from.get(tp.partition, 0))
            if committed is None and not start:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, start)
        return consumer

    def _add(self, received: Received, now: float) -> None:
        try:
            envelope = received.envelope()
        except DecodeError as e:
            log.warning("skipping an undecodable trajectory record at %d@%d: %s", received.partition,
                        received.offset, e)
            self.collector.next_offset[received.partition] = received.offset + 1
            return
        if envelope.WhichOneof("payload") != "trajectory":
            return
        self.collector.add(record_from_proto(envelope.trajectory), received.partition, received.offset, now)

    def _partitions(self, offsets: dict[int, int]) -> dict:
        from kafka import TopicPartition

        return {TopicPartition(self.bus.topic(topics.TRAJECTORIES), p): o for p, o in offsets.items()}

    def _train(self, groups: list[list[dict]], publisher: Publisher) -> None:
        from agentflow.trainer.loop import format_warmup, planner_prompts, score_records, tool_responses

        records = score_records([r for g in groups for r in g], self.settings.reward_kind)
        state = self.collector.checkpoint_state()
        store = self.trainer.store
        warmed = any(store.get(v).metadata.get("stage") == "format_warmup" for v in store.versions())
        started = time.monotonic()
        if self.settings.format_warmup_steps and not warmed:
            tools = [t for t in self.settings.tools.split(",") if t]
            responses = tool_responses(self.trainer.tokenizer, tools)
            metrics = format_warmup(self.trainer, planner_prompts(records), responses,
                                    steps=self.settings.format_warmup_steps, seed=self.settings.seed,
                                    checkpoint_extra=state)
            metrics.update(version=self.trainer.version, stage="format_warmup")
        else:
            metrics = self.trainer.step(records, checkpoint_extra=state)
        self.steps += 1
        metrics.update(step=self.steps, records=len(records), step_wall_s=time.monotonic() - started,
                       **{f"consumer_{k}": v for k, v in self.collector.counts.items()})
        if self.settings.metrics_file:
            with open(self.settings.metrics_file, "a", encoding="utf-8") as f:
                f.write(json.dumps({"t_unix": round(time.time(), 3), **metrics}, default=str) + "\n")
        if not metrics.get("skipped"):
            self._announce(publisher, self.trainer.version, metrics)
        self.progress(_progress_line(metrics))

    def _announce(self, publisher: Publisher, version: int, metrics: dict | None = None) -> None:
        checkpoint = self.trainer.store.get(version)
        event = events_pb2.PlannerVersion(
            version=version_name(version), checkpoint_uri=checkpoint.uri,
            parent_version=version_name(checkpoint.metadata["parent"]) if checkpoint.metadata.get("parent") is not None
            else "", created_at_unix_ms=int(checkpoint.metadata.get("created_at_unix", time.time()) * 1000))
        for key, value in (metrics or checkpoint.metadata.get("metrics", {})).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                event.metrics[key] = float(value)
        publisher.publish(topics.PLANNER_VERSIONS, new_envelope(VERSIONS_KEY, version, event))
        publisher.flush(timeout_s=30)

    def stop(self) -> None:
        self.stop_event.set()


def _offset_and_metadata(offset: int):
    from kafka.structs import OffsetAndMetadata

    try:
        return OffsetAndMetadata(offset, "", -1)
    except TypeError:  # older kafka-python: (offset, metadata)
        return OffsetAndMetadata(offset, "")


def _base_model(spec: str) -> str:
    if spec in ("smollm2",):
        from agentflow.llm.models import smollm2_dir

        return str(smollm2_dir())
    return str(local_copy(spec)) if spec else spec  # a remote base model is downloaded into the cache


def _progress_line(m: dict) -> str:
    if m.get("stage") == "format_warmup":
        return f"step {m['step']}: format warm-up -> v{m['version']} ({m.get('warmup_s', 0):.1f} s)"
    if m.get("skipped"):
        return f"step {m['step']}: skipped (no group with a reward spread) reward {m.get('reward', 0):.3f}"
    return (f"step {m['step']}: v{m['version']} reward {m.get('reward', 0):.3f} kl {m.get('kl', 0):.4f} "
            f"clip {m.get('clip_frac_low', 0) + m.get('clip_frac_high', 0):.3f} entropy {m.get('entropy', 0):.3f} "
            f"grad {m.get('grad_norm', 0):.3f} {m.get('tokens_per_s', 0):.0f} tok/s ({m['step_wall_s']:.1f} s)")


def serve_trainer(settings: TrainerSettings, bus: BusConfig) -> TrainerService:
    """Run the service until SIGTERM/SIGINT (the current step finishes and is committed first)."""
    from agentflow.runtime import on_stop_signal

    service = TrainerService(settings, bus, progress=lambda line: print(line, flush=True))
    on_stop_signal(service.stop)
    service.run()
    return service
