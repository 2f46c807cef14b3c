"""The topics of the event ring (docs/event-bus.md, docs/architecture.md), and their explicit creation.

Names here are logical; ``BusConfig.topic(name)`` adds the configured prefix. Topics are created explicitly with the
configured partition count because tansu (and many Kafka clusters) would otherwise auto-create them with a
default the services did not choose.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agentflow.bus.config import RECORD_OVERHEAD, BusConfig
from agentflow.errors import AgentFlowError, Reason

log = logging.getLogger(__name__)

QUERIES = "queries"
MEMORY_UPDATED = "memory.updated"
PLANS = "plans"
EXECUTIONS = "executions"
VERDICTS = "verdicts"
FINALIZE = "finalize"
ANSWERS = "answers"
TRAJECTORIES = "trajectories"
FEEDBACK = "feedback"
PLANNER_VERSIONS = "planner.versions"
#: Where each deployment's planner versions are served and their weights (one record per deployment, latest wins):
#: the routing table the planner's client follows.
PLANNER_ROUTING = "planner.routing"
#: The rollout controller's decisions on planner versions (canary, step, promote, rollback, ...).
ROLLOUT_DECISIONS = "rollout.decisions"
DEADLETTER = "deadletter"
#: The memory service's own state, one record per trajectory id (latest wins), replayed after a restart.
MEMORY_CHANGELOG = "memory.changelog"
#: The trainer's count of training groups it is done with (one key, latest wins): what bounds the rollout drivers.
TRAINER_PROGRESS = "trainer.progress"

RING = (QUERIES, MEMORY_UPDATED, PLANS, EXECUTIONS, VERDICTS, FINALIZE, ANSWERS, TRAJECTORIES, FEEDBACK,
        PLANNER_VERSIONS, PLANNER_ROUTING, ROLLOUT_DECISIONS, DEADLETTER)
ALL = RING + (MEMORY_CHANGELOG, TRAINER_PROGRESS)
#: Topics whose old records per key are removed by log compaction instead of by age.
COMPACTED = frozenset({MEMORY_CHANGELOG, PLANNER_ROUTING, TRAINER_PROGRESS})

_TOPIC_ALREADY_EXISTS = 36


class TopicError(AgentFlowError):
    """A topic could not be created."""

    reason = Reason.UNAVAILABLE


def topic_configs(name: str, config: BusConfig | None = None) -> dict[str, str]:
    """Broker-side settings for a logical topic: compaction, and the largest record batch the broker accepts
    (``max.message.bytes``: ``max_record_bytes`` plus framing; Apache Kafka enforces it, tansu ignores it)."""
    limit = (config or BusConfig()).max_record_bytes + RECORD_OVERHEAD
    return {"max.message.bytes": str(limit), **({"cleanup.policy": "compact"} if name in COMPACTED else {})}


def ensure_topics(config: BusConfig, names: Iterable[str] | None = None, *, admin=None) -> list[str]:
    """Create the logical topics ``names`` (default: all of ``ALL``) that do not exist yet; returns those created.

    Idempotent: existing topics are left as they are (their partition count is not changed — tansu cannot add
    partitions). ``admin`` is an open ``KafkaAdminClient`` to reuse; otherwise one is opened and closed here.
    Nothing is done when ``config.create_topics`` is off: the topics are managed elsewhere (Strimzi KafkaTopics),
    and a client restricted by ACLs may not create them.
    """
    names = list(dict.fromkeys(ALL if names is None else names))
    if not names or not config.create_topics:
        return []
    own = admin is None
    if own:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(**config.admin_options())
    try:
        request = {config.topic(n): {"num_partitions": config.partitions,
                                     "replication_factor": config.replication_factor,
                                     "configs": topic_configs(n, config)} for n in names}
        response = admin.create_topics(request, raise_errors=False)
    finally:
        if own:
            admin.close()
    created, failed = [], []
    for result in response["topics"]:
        code = result["error_code"]
        if code == 0:
            created.append(result["name"])
        elif code != _TOPIC_ALREADY_EXISTS:
            failed.append(f"{result['name']}: {result.get('error_message') or f'error code {code}'}")
    if failed:
        raise TopicError("could not create topics: " + "; ".join(failed))
    if created:
        log.info("created topics %s (%d partitions)", ", ".join(created), config.partitions)
    return created
