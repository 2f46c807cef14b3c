"""`agentflow train`: the Flow-GRPO trainer as a consumer of the `trajectories` topic (docs/training.md).

::

    trajectories ──> GroupCollector (training records by group id; complete at G, or at the straggler timeout;
                     ready once every record has a reward from the configured sources: rule, the feedback ledger and
                     the group vote are added here, feedback and judge rewards arrive with re-emitted records)
                 ──> Trainer.step (staleness filter, updates, checkpoint)
                 ──> planner.versions (the new version's URI)  ──> commit the offsets the step used
                 ──> trainer.progress (groups finished: trained on or dropped; what bounds the drivers)
    rollout.decisions ──> quarantine: groups a version rolled back on a tripwire served are dropped, not trained on

Under torchrun (docs/training.md, "GPU training") every rank builds the service; rank 0 consumes, groups and scores,
and hands each step's records to the other ranks (``follow``), which train their share of them; only rank 0 writes
versions, announces them and commits offsets.

Exactly-once training across crashes: a checkpoint's metadata holds the offsets to resume from (per partition, the
first record not yet used) and the group ids it trained on; a restarted trainer resumes from its newest checkpoint,
seeks each partition to the later of that offset and the committed one, and skips records of groups already
trained. Offsets are committed only after the checkpoint that used them is written, so nothing is lost either.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping

from agentflow import cli_args
from agentflow.bus import topics
from agentflow.bus.clients import AssignedConsumer, Follower, Publisher, Received
from agentflow.bus.codec import DecodeError, new_envelope
from agentflow.bus.config import BusConfig
from agentflow.config import ConfigFile, flag_name, from_env, setting
from agentflow.errors import InvalidInput
from agentflow.domain.convert import record_from_proto
from agentflow.domain.trajectory import RATINGS_FIRST, REWARD_PRECEDENCE, Record
from agentflow.proto.v1 import events_pb2
from agentflow.rewards import kind_names
from agentflow.storage import local_copy
from agentflow.tools import tool_names
from agentflow.trainer.checkpoint import ModelStore
from agentflow.trainer.grpo import OBJECTIVES, GRPOConfig
from agentflow.trainer.lora import EXPORTS, LoraConfig
from agentflow.trainer.metrics import VersionLag, trainer_metrics
from agentflow.trainer.rewarding import GroupRewards, parse_sources
from agentflow.trainer.tracking import Tracker, open_tracker
from agentflow.versions import Served, newest_announcement, quarantined_version, version_name

log = logging.getLogger(__name__)
KEEP_TRAINED_GROUPS = 5000  # group ids remembered in a checkpoint (far more than a step's redelivery window)
VERSIONS_KEY = "planner"  # every planner.versions event has this key: one partition, in order
PROGRESS_KEY = "trainer"  # every trainer.progress event has this key (a compacted topic: the newest stays)
PROGRESS_EVERY_S = 1.0  # the groups finished are published at most this often, when they changed
#: the collector's counts of groups left out, by reason, that trainer.progress carries (agentflow status shows them):
#: short of 2 records at the group timeout, unrewarded after reward_wait_s, flat (dynamic sampling), quarantined
LEFT_OUT = ("groups_dropped", "groups_unrewarded", "groups_no_signal", "groups_quarantined")
LEDGER_FILE = "feedback-ledger.json"  # in a version folder: the feedback ledger when that version was saved


#: The names of before the GRPO settings were nested: AGENTFLOW_TRAINER_<OLD> and --<old> -> the GRPOConfig field
#: that replaced them (AGENTFLOW_TRAINER_GRPO_<NEW>, --grpo-<new>). Read, with a warning, until the next release;
#: batch_queries (groups per step) became batch_trajectories = batch_queries x group_size.
OLD_GRPO_NAMES = {"group_size": "group_size", "batch_queries": "batch_trajectories", "learning_rate": "lr",
                  "beta": "beta", "eps_low": "eps_low", "eps_high": "eps_high",
                  "updates_per_batch": "updates_per_batch", "max_staleness": "max_staleness"}
OLD_BATCH_QUERIES = 6  # the default of the old batch_queries
_DEPRECATED = "%s is deprecated and will be removed in the next release: use %s%s"


@dataclass(frozen=True)
class TrainerSettings:
    """`agentflow train` settings; each is also AGENTFLOW_TRAINER_<NAME>, and each GRPO setting
    AGENTFLOW_TRAINER_GRPO_<NAME> (the chart sets them that way). Build them with ``trainer_settings``."""

    model_store: str = setting(".agentflow/models", "folder or fsspec URI (s3://bucket/models) of the versioned "
                                                    "checkpoints (v000000, v000001, ...)", cli_args.text(),
                               group="model store and versions")
    base_model: str = setting("", "the planner to start from when the store is empty: a model folder, its fsspec "
                                  "URI, 'smollm2', or 'tiny' (the random tiny planner `agentflow model tiny` "
                                  "builds, seed 0: the chart's llmServer.model tiny)",
                              cli_args.uri_or(cli_args.folder, words=("smollm2", "tiny")),
                              group="model store and versions")
    grpo: GRPOConfig = setting(GRPOConfig(batch_trajectories=OLD_BATCH_QUERIES * 8, max_staleness=4),
                               "the Flow-GRPO settings (trainer/grpo.py); a group is complete with group_size "
                               "trajectories, and a step trains batch_trajectories / group_size complete groups",
                               group="Flow-GRPO (--grpo-*)")
    group_timeout_s: float = setting(120.0, "a group still short of G after this long is used as it is "
                                            "(>= 2 records)", cli_args.number(0, lo_open=True),
                                     group="groups and rewards")
    micro_batch_rows: int = setting(256, "planner turns per forward/backward (gradient accumulation)",
                                    cli_args.integer(1), group="compute")
    micro_batch_tokens: int = setting(0, "padded tokens per forward/backward, besides micro_batch_rows (0: no limit)",
                                     cli_args.integer(0), group="compute")
    device: str = setting("", "cpu, cuda or cuda:N (empty: cuda when available; under torchrun, LOCAL_RANK's GPU)",
                          cli_args.matching(r"cpu|cuda(:\d+)?", "cpu, cuda or cuda:N"), group="compute")
    dtype: str = setting("", "bfloat16 or float32 compute (empty: bfloat16 on GPUs, float32 on CPUs); the weights "
                             "that train and AdamW's state stay float32",
                         cli_args.names(("bfloat16", "float32"), one=True), group="compute")
    gradient_checkpointing: bool = setting(False, "recompute the decoder layers in backward instead of keeping "
                                                  "their activations", group="compute")
    peak_tflops: float = setting(0.0, "one device's peak TFLOP/s in the training dtype (989: an H100 or H200 in "
                                      "bfloat16, dense), for the mfu metric; 0: not computed", cli_args.number(0),
                                 group="compute")
    lora: LoraConfig = setting(LoraConfig(), "low-rank adapters (peft): only they train (rank 0: every weight)",
                               group="LoRA (--lora-*)")
    export: str = setting("adapter", "with LoRA, what a version holds: adapter (the adapter folder) or merged",
                          cli_args.names(EXPORTS, one=True), group="model store and versions")
    keep_last: int = setting(10, "newest checkpoints kept, besides v0, the reference and those the rollout "
                                 "controller serves (0: all)", cli_args.integer(0), group="model store and versions")
    keep_resume: int = setting(2, "versions that keep their resume/ state, the newest (0: all); a restart reads "
                                  "only the newest's", cli_args.integer(0), group="model store and versions")
    reward_kind: str = setting("math", "rule that scores a record against its ground truth (agentflow.rewards); "
                                       "also how answers are compared by the vote and the feedback ledger",
                               cli_args.names(kind_names, one=True), group="groups and rewards")
    reward_sources: str = setting("rule,human,vote,judge", "the rewards trained on, comma-separated (human = "
                                  "feedback); where a record has several, the most trusted wins: rule, human, vote, "
                                  "judge (docs/rewards.md)", cli_args.names((*REWARD_PRECEDENCE, "feedback")),
                                  group="groups and rewards")
    ratings_over_rule: bool = setting(False, "people's ratings outrank the rule reward against the ground truth (off: "
                                             "a rating never overrides the ground truth)", group="groups and rewards")
    feedback_min_raters: int = setting(2, "distinct raters who must rate an answer up before the feedback ledger "
                                          "takes it as confirmed (every other answer to that query then scores 0)",
                                       cli_args.integer(1), group="groups and rewards")
    vote_min_agreement: float = setting(0.5, "a group vote needs its majority answer from at least this share of "
                                             "the group (and no tie)", cli_args.number(0, 1),
                                        group="groups and rewards")
    dynamic_sampling: bool = setting(False, "DAPO's dynamic sampling: a complete group whose rewards are all equal is "
                                            "dropped (groups_no_signal) before it takes a place in a batch",
                                     group="groups and rewards")
    reward_wait_s: float = setting(600.0, "a complete group with records still unrewarded waits this long for their "
                                          "feedback or judge reward; then it trains on its rewarded records (>= 2) "
                                          "or is dropped — never on a default", cli_args.number(0),
                                   group="groups and rewards")
    format_warmup_steps: int = setting(0, "before the first update, this many SFT steps that make the tool choice "
                                          "uniform (tiny planners; docs/training.md); 0 = none",
                                       cli_args.integer(0), group="objective")
    tools: str = setting("python,search,generalist", "the planner's tools, for the format warm-up",
                         cli_args.names(tool_names), group="objective")
    objective: str = setting("tis", "what is minimised: " + "; ".join(
        f"{o.name} = {o.help}" for o in OBJECTIVES.values()), cli_args.names(OBJECTIVES, one=True), group="objective")
    behaviour_bound: float = setting(0.2, "nats per token: a group whose served log-probs differ from the trainer's "
                                          "own by more than this on its rows of the version being trained is "
                                          "quarantined, not trained on (0: measure only; -1: no check, no extra "
                                          "forward pass; docs/training.md)", cli_args.number(-1), group="objective")
    profile: str = setting("", "recorded in every checkpoint's metadata (which profile produced the rollouts)",
                           cli_args.text(), group="metrics and tracking")
    metrics_file: str = setting("", "append each step's metrics as one JSON line to this file", cli_args.text(),
                                group="metrics and tracking")
    tensorboard_dir: str = setting("", "write TensorBoard event files of each run under this folder when "
                                       "MLFLOW_TRACKING_URI is not set (docs/training.md, \"Experiment tracking\")",
                                   cli_args.text(), group="metrics and tracking")
    metrics_port: int = setting(-1, "serve Prometheus /metrics on this port (-1: off, 0: any free port)",
                                cli_args.port(off=True), group="metrics and tracking")
    metrics_host: str = setting("127.0.0.1", "address of the metrics endpoint (0.0.0.0 in a pod)", cli_args.text(),
                                group="metrics and tracking")
    max_steps: int = setting(0, "stop after this many steps (0: run until stopped)", cli_args.integer(0), group="run")
    seed: int = setting(0, "torch seed", group="run")

    def __post_init__(self):
        if self.group_timeout_s <= 0 or self.reward_wait_s < 0:
            raise InvalidInput("trainer group_timeout_s must be > 0 and reward_wait_s >= 0")
        parse_sources(self.reward_sources)
        if self.objective not in OBJECTIVES:
            raise InvalidInput(f"trainer objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.export not in EXPORTS:
            raise InvalidInput(f"trainer export must be one of {', '.join(EXPORTS)}, got {self.export!r}")
        if self.dynamic_sampling and self.grpo.keep_flat_groups:
            raise InvalidInput("dynamic_sampling drops the groups without a reward spread that grpo.keep_flat_groups "
                               "trains on the KL penalty: choose one")
        if self.format_warmup_steps and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise InvalidInput("the format warm-up is for tiny planners on one process: not under torchrun")

    @property
    def group_size(self) -> int:
        return self.grpo.group_size

    @property
    def batch_queries(self) -> int:
        """Complete groups per training step."""
        return self.grpo.queries_per_batch

    def train_config(self):
        """The trainer's ``TrainConfig``: the fields it shares with these settings as they are, and those the command
        line spells its own way converted (0 or -1 for none, a comma-separated list, a switch for the precedence)."""
        from agentflow.trainer.loop import TrainConfig

        spelled = {"keep_last": self.keep_last or None, "reward_sources": parse_sources(self.reward_sources),
                   "reward_precedence": RATINGS_FIRST if self.ratings_over_rule else REWARD_PRECEDENCE,
                   "behaviour_bound": None if self.behaviour_bound < 0 else self.behaviour_bound}
        same = ({f.name for f in fields(self)} & {f.name for f in fields(TrainConfig)}) - set(spelled)
        return TrainConfig(**{name: getattr(self, name) for name in same}, **spelled)


def trainer_settings(environ: Mapping[str, str] | None = None, flags: Mapping[str, object] | None = None,
                     config: ConfigFile | None = None) -> TrainerSettings:
    """``TrainerSettings`` from AGENTFLOW_TRAINER_*, then ``config`` (a ``--config`` file's), then ``flags`` (field ->
    value, the GRPO group's as ``"grpo.<name>"``; None = not given), validated once.

    The old names of ``OLD_GRPO_NAMES`` (AGENTFLOW_TRAINER_LEARNING_RATE, --learning-rate, ...) are still read, each
    with a logged warning naming its replacement; where an old and a new name are both given, the new one wins.
    """
    environ = dict(os.environ if environ is None else environ)
    flags = {name: value for name, value in (flags or {}).items() if value is not None}
    old_env, old_flags = {}, {}
    for old, new in OLD_GRPO_NAMES.items():
        note = " (trajectories per step = batch_queries x group_size)" if old == "batch_queries" else ""
        old_var, new_var = f"AGENTFLOW_TRAINER_{old.upper()}", f"AGENTFLOW_TRAINER_GRPO_{new.upper()}"
        if old_var in environ:
            log.warning(_DEPRECATED, old_var, new_var, note)
            old_env[old] = environ.pop(old_var)
            if old != "batch_queries":
                environ.setdefault(new_var, old_env[old])
        if old in flags:
            log.warning(_DEPRECATED, flag_name(old), flag_name(f"grpo.{new}"), note)
            old_flags[old] = flags.pop(old)
            if old != "batch_queries":
                flags.setdefault(f"grpo.{new}", old_flags[old])
    old_values = {**old_env, **old_flags}  # a flag wins
    given = {**(config.values if config else {}), **flags}
    batch_given = "grpo.batch_trajectories" in given or "AGENTFLOW_TRAINER_GRPO_BATCH_TRAJECTORIES" in environ
    if ("batch_queries" in old_values or "group_size" in old_values) and not batch_given:  # old: batch_queries x G
        group_size = given.get("grpo.group_size", environ.get("AGENTFLOW_TRAINER_GRPO_GROUP_SIZE",
                                                              TrainerSettings().grpo.group_size))
        queries = _whole(old_values.get("batch_queries", OLD_BATCH_QUERIES), "AGENTFLOW_TRAINER_BATCH_QUERIES")
        flags["grpo.batch_trajectories"] = queries * _whole(group_size, "AGENTFLOW_TRAINER_GRPO_GROUP_SIZE")
    return from_env(TrainerSettings, "TRAINER_", environ=environ, flags=flags, config=config)


def _whole(value, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidInput(f"{name}={value!r} is not a valid int") from None


# --- grouping (pure) ---------------------------------------------------------------------------------------------


@dataclass
class _Group:
    first_seen: float
    records: dict = field(default_factory=dict)  # trajectory id -> record (a re-emitted record replaces it)
    positions: list = field(default_factory=list)  # (partition, offset) of every record of the group
    complete_at: float | None = None  # when it had G records (or its straggler timeout passed with >= 2)


class GroupCollector:
    """Training records by group id. A group is complete when it has ``group_size`` distinct trajectories or its
    straggler timeout passes (with fewer than 2 it is dropped). With ``rewards``, a complete group is ready once
    every record has a reward (``GroupRewards``); one still waiting after ``reward_wait_s`` goes on with its rewarded
    records (>= 2) or is dropped. Without ``rewards`` a complete group is ready at once. ``take`` hands ready groups
    out; ``resume_offsets`` says where a restart must start reading so that no record not yet used is lost.

    With ``dynamic_sampling`` (and ``rewards``), a ready group whose rewards are all equal is dropped
    (``groups_no_signal``) instead of taking a place in a batch: a step waits for groups that can teach something
    (DAPO's dynamic sampling; docs/training.md).

    A group served by a ``quarantine``d version (rolled back on a tripwire, docs/rollout.md) is dropped
    (``groups_quarantined``) whenever it is found, collecting or ready: it stays on the topic and is never trained on.
    """

    def __init__(self, group_size: int, timeout_s: float, trained: set[str] | None = None, *,
                 rewards: GroupRewards | None = None, reward_wait_s: float = 600.0, dynamic_sampling: bool = False,
                 groups_done: int = 0):
        self.group_size, self.timeout_s = group_size, timeout_s
        self.groups_done = groups_done  # groups taken or dropped, over the trainer's life (in its checkpoints)
        self.rewards, self.reward_wait_s = rewards, reward_wait_s
        self.dynamic_sampling = dynamic_sampling
        self.trained: set[str] = set(trained or ())
        self.trained_order: list[str] = list(trained or ())
        self.groups: dict[str, _Group] = {}  # collecting, or complete and waiting for rewards
        self.ready: dict[str, _Group] = {}  # ready, in the order they became ready
        self.next_offset: dict[int, int] = {}  # partition -> offset after the last record seen
        self.counts = {"records": 0, "ignored": 0, "already_trained": 0, "groups_timed_out": 0, "groups_dropped": 0,
                       "groups_partly_rewarded": 0, "groups_unrewarded": 0, "groups_no_signal": 0,
                       "groups_quarantined": 0, "ratings": 0}
        self.quarantined: frozenset[str] = frozenset()

    def add(self, record: dict, partition: int, offset: int, now: float) -> None:
        self.next_offset[partition] = max(self.next_offset.get(partition, 0), offset + 1)
        self.counts["records"] += 1
        gid = record.get("group_id")
        if record.get("source") != "training" or not gid:
            self.counts["ignored"] += 1
            if self.rewards is not None and self.rewards.observe(record):
                self.counts["ratings"] += 1
            return
        if gid in self.trained:
            self.counts["already_trained"] += 1
            return
        group = self.ready.get(gid) or self.groups.setdefault(gid, _Group(now))
        group.records[record["trajectory_id"]] = record  # a re-emitted record (e.g. feedback joined) replaces it
        group.positions.append((partition, offset))

    def ready_count(self, now: float) -> int:
        """Move complete groups whose records are rewarded (or whose waits ran out) to ready, drop those that
        cannot train; return how many groups are ready."""
        self._drop_quarantined()
        for gid, group in list(self.groups.items()):
            if group.complete_at is None:
                if len(group.records) >= self.group_size:
                    group.complete_at = now
                elif now - group.first_seen >= self.timeout_s:
                    if len(group.records) < 2:
                        self._drop(gid, "groups_dropped")
                        continue
                    self.counts["groups_timed_out"] += 1
                    group.complete_at = now
            if group.complete_at is not None:
                self._settle(gid, group, now)
        return len(self.ready)

    def _settle(self, gid: str, group: _Group, now: float) -> None:
        if self.rewards is None:
            self.ready[gid] = self.groups.pop(gid)
            return
        records = self.rewards.apply(list(group.records.values()))
        rewarded = {r["trajectory_id"]: r for r in records if self.rewards.reward(r) is not None}
        if len(rewarded) < len(records):
            if now - group.complete_at < self.reward_wait_s:
                return
            if len(rewarded) < 2:
                self._drop(gid, "groups_unrewarded")
                return
            self.counts["groups_partly_rewarded"] += 1
            group.records = rewarded
        if self.dynamic_sampling and len({self.rewards.reward(r) for r in rewarded.values()}) < 2:
            self._drop(gid, "groups_no_signal")
            return
        self.ready[gid] = self.groups.pop(gid)

    def quarantine(self, version: str) -> None:
        """Train on no group ``version`` served (callable from another thread: the set is replaced, not changed)."""
        self.quarantined = self.quarantined | {version}

    def _drop_quarantined(self) -> None:
        quarantined = self.quarantined
        if not quarantined:
            return
        for pool in (self.groups, self.ready):
            for gid, group in list(pool.items()):
                if any(Record(r).planner_versions() & quarantined for r in group.records.values()):
                    del pool[gid]
                    self.counts["groups_quarantined"] += 1
                    self._mark_trained(gid)

    def _drop(self, gid: str, count: str) -> None:
        del self.groups[gid]
        self.counts[count] += 1
        self._mark_trained(gid)

    def take(self, n: int) -> list[list[dict]]:
        """The ``n`` oldest ready groups' records (their ids are remembered as trained)."""
        taken = list(self.ready)[:n]
        out = [list(self.ready.pop(gid).records.values()) for gid in taken]
        for gid in taken:
            self._mark_trained(gid)
        return out

    def _mark_trained(self, gid: str) -> None:
        self.groups_done += 1
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
                "trained_groups": self.trained_order[-KEEP_TRAINED_GROUPS:], "groups_done": self.groups_done}


# --- the service -------------------------------------------------------------------------------------------------


class TrainerService:
    """The consume -> group -> step -> checkpoint -> announce -> commit loop."""

    def __init__(self, settings: TrainerSettings, bus: BusConfig, *, progress=print):
        from agentflow.trainer.loop import Trainer

        self.settings, self.bus, self.progress = settings, bus, progress
        store = ModelStore(settings.model_store)
        empty = not store.versions()
        if empty and not settings.base_model:
            raise InvalidInput(f"the model store {settings.model_store} is empty: give a base model "
                               "(--base-model or AGENTFLOW_TRAINER_BASE_MODEL)")
        config = settings.train_config()
        base = _base_model(settings.base_model) if empty else settings.base_model  # only an empty store needs it
        metadata = {"profile": settings.profile, "objective": settings.objective, "service": "agentflow train"}
        self._new_trainer = lambda config: Trainer(base, store, config, seed=settings.seed, metadata=metadata)
        self.trainer = self._new_trainer(config)
        self.served = Served()  # what the rollout controller's decisions serve
        newest = store.get(self.trainer.version)
        latest = newest.metadata
        rewards = GroupRewards(settings.reward_kind, parse_sources(settings.reward_sources),
                               settings.vote_min_agreement, min_raters=settings.feedback_min_raters,
                               precedence=config.reward_precedence)
        self._restore_ledger(rewards, newest)
        self.collector = GroupCollector(settings.group_size, settings.group_timeout_s,
                                        set(latest.get("trained_groups", ())), rewards=rewards,
                                        reward_wait_s=settings.reward_wait_s,
                                        dynamic_sampling=settings.dynamic_sampling,
                                        groups_done=int(latest.get("groups_done", 0)))
        self.resume_from = {int(p): o for p, o in latest.get("consumer_offsets", {}).items()}
        self.stop_event = threading.Event()
        self.steps = 0
        self.trained_steps = 0  # steps that trained: not skipped, not the format warm-up
        self._progress = (-1, 0.0)  # the groups finished last published, and when
        self.version_lag = VersionLag(trainer_metrics().version_lag)
        # rank 0's run (params, step metrics); every version it writes names the run (docs/training.md)
        self.tracker = Tracker() if not self.trainer.world.main else open_tracker(
            f"train-{version_name(self.trainer.version)}", settings, tensorboard_dir=settings.tensorboard_dir)
        self.trainer.metadata.update(self.tracker.link)

    def _trainer_like(self, config):
        """A new Trainer on the store's newest version with ``config`` and this one's metadata (its run link)."""
        trainer = self._new_trainer(config)
        trainer.metadata.update(self.trainer.metadata)
        trainer.in_service = self.trainer.in_service
        return trainer

    def run(self) -> None:
        """Rank 0's loop (the only one without torchrun); the other ranks ``follow`` it."""
        world = self.trainer.world
        if not world.main:
            return self.follow()
        try:
            self._consume()
        finally:
            world.broadcast(None)  # the other ranks stop with rank 0
            self.tracker.log_artifact(self.settings.metrics_file)
            self.tracker.close()

    def follow(self) -> None:
        """A rank other than 0: train on the records rank 0 hands out, until it hands out None."""
        while (step := self.trainer.world.broadcast()) is not None:
            records, state = step
            self.trainer.step(records, checkpoint_extra=state)

    def _consume(self) -> None:
        topics.ensure_topics(self.bus, [topics.TRAJECTORIES, topics.PLANNER_VERSIONS, topics.ROLLOUT_DECISIONS,
                                        topics.TRAINER_PROGRESS])
        self._follow_decisions()
        self._publisher = Publisher(self.bus, client_id=f"{self.bus.client_id}-trainer")
        if self.trainer.version > self._last_announced():  # e.g. a crash between checkpoint and announcement
            self._announce(self._publisher, self.trainer.version)
        self._report_progress(force=True)  # the base the drivers count from, before any group is used
        # Every partition assigned (the trainer is a single instance), each from the later of its committed offset
        # and the newest checkpoint's resume offset.
        self._consumer = AssignedConsumer(self.bus, topics.TRAJECTORIES, self.bus.group_id or "trainer",
                                          self._on_batch, offsets=self.resume_from, stop=self.stop_event,
                                          name="trainer", poll_s=0.5, wait_s=30, max_poll_records=500)
        try:
            self._consumer.run()
        finally:
            self._publisher.close(timeout_s=5)

    def _on_batch(self, records: list[Received]) -> None:
        """Group the new records; once enough groups are ready: train, checkpoint, announce, then commit."""
        now = time.monotonic()
        for received in records:
            self._add(received, now)
        trainer_metrics().lag.set(self._consumer.lag())
        if self.collector.ready_count(now) >= self.settings.batch_queries:
            self._train(self.collector.take(self.settings.batch_queries), self._publisher)
            self._consumer.commit(self.collector.resume_offsets())  # only after the checkpoint that used them
            if self.settings.max_steps and self.steps >= self.settings.max_steps:
                self.stop_event.set()
        self._report_progress()

    def _report_progress(self, force: bool = False) -> None:
        """Publish the groups finished (trainer.progress, trainer/pace.py) when they changed, at most every
        ``PROGRESS_EVERY_S``."""
        done, now = self.collector.groups_done, time.monotonic()
        if not force and (done == self._progress[0] or now - self._progress[1] < PROGRESS_EVERY_S):
            return
        left_out = {k.removeprefix("groups_"): v for k, v in self.collector.counts.items()
                    if k in LEFT_OUT and v}
        event = events_pb2.TrainerProgress(groups_done=done, steps=self.steps, trained_steps=self.trained_steps,
                                           version=version_name(self.trainer.version), groups_left_out=left_out)
        self._publisher.publish(topics.TRAINER_PROGRESS, new_envelope(PROGRESS_KEY, self.steps, event))
        self._progress = (done, now)

    def _last_announced(self) -> int:
        """The newest version on ``planner.versions`` (-1 when none)."""
        newest = newest_announcement(self._read_all(topics.PLANNER_VERSIONS))
        return newest[0] if newest else -1

    def _read_all(self, topic: str) -> list[Received]:
        """The records on ``topic`` (read until a second passes without a new one)."""
        from agentflow.bus.clients import TopicReader

        with TopicReader(self.bus, topic, timeout_s=30) as reader:
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < 1.0:
                if reader.poll(0.2):
                    quiet_since = time.monotonic()
            return reader.records

    def _follow_decisions(self) -> None:
        """Quarantine the versions the rollout controller rolled back on a tripwire: those decided so far before
        the first group is taken, later ones as they are published."""
        from kafka import TopicPartition

        decided = self._read_all(topics.ROLLOUT_DECISIONS)
        for received in decided:
            self.on_decision(received)
        after = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in decided}
        Follower(self.bus, [topics.ROLLOUT_DECISIONS], self.on_decision, offsets=after, stop=self.stop_event,
                 name="trainer-decisions").start()

    def on_decision(self, received: Received) -> None:
        """A ``rollout.decisions`` record: the versions the controller serves are kept when old versions are pruned
        (``versions.Served``); a rollback on a tripwire quarantines the version."""
        try:
            envelope = received.envelope()
        except DecodeError:
            return
        if not envelope.HasField("rollout_decision"):
            return
        self.served = self.served.after(envelope.rollout_decision)
        self.trainer.in_service = self.served.versions()
        version = quarantined_version(envelope.rollout_decision)
        if version and version not in self.collector.quarantined:
            log.warning("planner version %s was rolled back on a tripwire; its training groups are not trained on "
                        "(%s)", version, envelope.rollout_decision.reason[:300])
            self.collector.quarantine(version)

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
        record = record_from_proto(envelope.trajectory)
        self.version_lag.observe(record)
        self.collector.add(record, received.partition, received.offset, now)

    def _train(self, groups: list[list[dict]], publisher: Publisher) -> None:
        from agentflow.trainer.warmup import format_warmup, planner_prompts, tool_responses

        records = [r for g in groups for r in g]  # rewarded by the collector
        state = self.collector.checkpoint_state()
        ledger = self.collector.rewards.ledger
        files = {LEDGER_FILE: ledger.dumps()} if ledger is not None and len(ledger) else None
        store = self.trainer.store
        warmed = any(store.get(v).metadata.get("stage") == "format_warmup" for v in store.versions())
        started = time.monotonic()
        if self.settings.format_warmup_steps and not warmed:
            tools = [t for t in self.settings.tools.split(",") if t]
            lora = self.trainer.config.lora.enabled
            # with LoRA the warm-up trains a full-parameter copy; the adapters then start on the warmed version,
            # which is their base and the KL reference
            warmer = self._trainer_like(replace(self.trainer.config, lora=LoraConfig())) if lora else self.trainer
            metrics = format_warmup(warmer, planner_prompts(records), tool_responses(warmer.tokenizer, tools),
                                    steps=self.settings.format_warmup_steps, seed=self.settings.seed,
                                    checkpoint_extra=state, checkpoint_files=files)
            metrics.update(version=warmer.version, stage="format_warmup")
            if lora:
                self.trainer = self._trainer_like(self.trainer.config)
        else:
            self.trainer.world.broadcast((records, state))
            metrics = self.trainer.step(records, checkpoint_extra=state, checkpoint_files=files)
        self.steps += 1
        metrics.update(step=self.steps, records=len(records), step_wall_s=time.monotonic() - started,
                       version_lags_s=[round(lag, 2) for lag in self.version_lag.take()],
                       **{f"consumer_{k}": v for k, v in self.collector.counts.items()})
        if self.settings.metrics_file:
            with open(self.settings.metrics_file, "a", encoding="utf-8") as f:
                f.write(json.dumps({"t_unix": round(time.time(), 3), **metrics}, default=str) + "\n")
        if not metrics.get("skipped"):
            self.trained_steps += metrics.get("stage") != "format_warmup"
            self._announce(publisher, self.trainer.version, metrics)
        trainer_metrics().observe(metrics)
        self.tracker.log_metrics(self.steps, metrics)
        self.progress(_progress_line(metrics))

    def _restore_ledger(self, rewards: GroupRewards, checkpoint) -> None:
        """The feedback ledger as the newest checkpoint saved it; the records after it are read again from the
        checkpoint's offsets (filing a rating again replaces it), so no rating is lost or counted twice."""
        if rewards.ledger is None:
            return
        path = Path(checkpoint.path) / LEDGER_FILE
        if path.is_file():
            known = rewards.ledger.loads(path.read_bytes())
            self.progress(f"feedback ledger: {known} rated queries from {version_name(checkpoint.version)}")

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
        self.version_lag.publish(event.version, time.time())

    def stop(self) -> None:
        self.stop_event.set()


def _base_model(spec: str) -> str:
    if spec in ("smollm2",):
        from agentflow.llm.models import smollm2_dir

        return str(smollm2_dir())
    if spec == "tiny":  # the same weights as every `agentflow model tiny` of seed 0 (a deterministic build)
        from agentflow.llm.models import build_tiny
        from agentflow.storage import cache_root

        return str(build_tiny(cache_root() / "tiny-seed0"))
    return str(local_copy(spec)) if spec else spec  # a remote base model is downloaded into the cache


def _progress_line(m: dict) -> str:
    if m.get("stage") == "format_warmup":
        return f"step {m['step']}: format warm-up -> v{m['version']} ({m.get('warmup_s', 0):.1f} s)"
    if m.get("skipped") and m.get("groups_quarantined"):
        return (f"step {m['step']}: skipped: {m['groups_quarantined']:.0f} group(s) quarantined, their served "
                f"log-probs {m.get('behaviour_abs_s0', 0):.3f} nats/token from the named version's")
    if m.get("skipped"):
        return f"step {m['step']}: skipped (no group with a reward spread) reward {m.get('reward', 0):.3f}"
    return (f"step {m['step']}: v{m['version']} reward {m.get('reward', 0):.3f} kl {m.get('kl', 0):.4f} "
            f"clip {m.get('clip_frac_low', 0) + m.get('clip_frac_high', 0):.3f} entropy {m.get('entropy', 0):.3f} "
            f"grad {m.get('grad_norm', 0):.3f} {m.get('tokens_per_s', 0):.0f} tok/s ({m['step_wall_s']:.1f} s)")


def serve_trainer(settings: TrainerSettings, bus: BusConfig) -> TrainerService:
    """Run the service until SIGTERM/SIGINT (the current step finishes and is committed first)."""
    from agentflow.services.runtime import on_stop_signal

    service = TrainerService(settings, bus, progress=lambda line: print(line, flush=True))
    if settings.metrics_port >= 0 and service.trainer.world.main:
        from agentflow import telemetry

        port = telemetry.serve_metrics(settings.metrics_port, settings.metrics_host)
        print(f"metrics on http://{settings.metrics_host}:{port}/metrics", flush=True)
    on_stop_signal(service.stop)
    service.run()
    return service
