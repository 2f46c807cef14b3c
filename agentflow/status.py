"""`agentflow status`: where the training loop stands, for an operator (docs/operations.md, "Where the loop
stands"). It reads the broker only: the trainer's progress (trainer.progress: steps, trained steps, groups left out
by reason), the newest version (planner.versions) and the rollout controller's recent decisions (rollout.decisions),
and says what is idle: a trainer that has not stepped, a canary undecided for long, no promotion yet. ``summarize``
is pure; ``read`` fetches the records; ``render`` prints them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentflow.errors import InvalidInput

DECISIONS_READ = 500  # the newest decisions per partition read (a long-lived topic keeps weeks of them)
TERMINAL = ("promote", "rollback", "reject")
IDLE_TRAINER_S = 3600.0  # the alerts' bounds (charts/agentflow/files/alerts.yaml)
UNDECIDED_S = 3 * 3600.0


@dataclass(frozen=True)
class Seen:
    """One record of a topic: when it was produced (unix ms) and its payload as a dict."""
    at_ms: int
    payload: dict


def summarize(progress: list[Seen], versions: list[Seen], decisions: list[Seen], now_ms: int,
              live: dict | None = None) -> dict:
    """Where the loop stands, from each topic's records in the order produced; ``live``: the controller's own
    metrics (``scrape``), whose arm counts are the running canary's now, not at its last decision."""
    def age(seen: Seen | None) -> float | None:
        return None if seen is None else round(max(0, now_ms - seen.at_ms) / 1000, 1)

    last_progress = progress[-1] if progress else None
    trainer = {**(last_progress.payload if last_progress else {}), "updated_s_ago": age(last_progress)}
    newest = versions[-1] if versions else None
    promotions = [d for d in decisions if d.payload.get("action") == "promote"]
    last = decisions[-1] if decisions else None
    canary = _running_canary(decisions)
    summary = {
        "trainer": trainer,
        "newest_version": {"version": newest.payload.get("version", ""), "age_s": age(newest)} if newest else None,
        "stable": (last.payload.get("stable_version") if last else "") or "",
        "last_promotion": ({"version": promotions[-1].payload.get("version", ""), "age_s": age(promotions[-1])}
                           if promotions else None),
        "canary": canary and {"version": canary.payload.get("version", ""),
                              "percent": canary.payload.get("percent", 0), "since_s": age(canary),
                              "reason": canary.payload.get("reason", ""),
                              "canary_arm": _arm(live, "canary") or canary.payload.get("canary", {}),
                              "stable_arm": _arm(live, "stable") or canary.payload.get("stable", {}),
                              "live": bool(live)},
        "last_decision": last and {"action": last.payload.get("action", ""), "version": last.payload.get("version"),
                                   "age_s": age(last), "reason": last.payload.get("reason", "")},
    }
    summary["alarms"] = alarms(summary)
    return summary


def _arm(live: dict | None, arm: str) -> dict:
    """An arm's counts from the controller's metrics ({} without them)."""
    if not live:
        return {}
    labels = (("arm", arm),)
    return {"samples": int(live.get(("agentflow_rollout_samples", labels), 0)),
            "reward_samples": int(live.get(("agentflow_rollout_rewarded_samples", labels), 0))}


def scrape(address: str, timeout_s: float = 5.0) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value from the Prometheus endpoint at ``address`` (host:port); {} when it does
    not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _running_canary(decisions: list[Seen]) -> Seen | None:
    """The newest canary or step decision whose version no later decision ended."""
    ended: set[str] = set()
    for d in reversed(decisions):
        action, version = d.payload.get("action"), d.payload.get("version", "")
        if action in TERMINAL:
            ended.add(version)
        elif action in ("canary", "step") and version not in ended:
            return d
    return None


def alarms(summary: dict) -> list[str]:
    """What is idle, in words (the same conditions the chart's alerts watch, at the same bounds)."""
    found = []
    trainer = summary["trainer"]
    if trainer.get("updated_s_ago") is None:
        found.append("no trainer progress on trainer.progress: is a trainer running?")
    elif trainer["updated_s_ago"] > IDLE_TRAINER_S:
        found.append(f"the trainer has finished no group for {trainer['updated_s_ago'] / 60:.0f} min")
    left_out = trainer.get("groups_left_out") or {}
    if left_out and not trainer.get("trained_steps"):
        found.append("groups are left out and no step trained: " + ", ".join(f"{k} {v}" for k, v in
                                                                                sorted(left_out.items())))
    canary = summary["canary"]
    if canary and canary["since_s"] is not None and canary["since_s"] > UNDECIDED_S:
        found.append(f"canary {canary['version']} undecided for {canary['since_s'] / 3600:.1f} h")
    if canary and int(canary["canary_arm"].get("samples", 0)) >= 200 \
            and not int(canary["canary_arm"].get("reward_samples", 0)):
        found.append(f"canary {canary['version']}: none of its trajectories carries the compared reward")
    return found


def render(summary: dict) -> str:
    """The summary as the lines `agentflow status` prints."""
    t = summary["trainer"]
    lines = []
    if t.get("updated_s_ago") is None:
        lines.append("trainer      no progress published")
    else:
        left = ", ".join(f"{k} {v}" for k, v in sorted((t.get("groups_left_out") or {}).items())) or "none"
        lines.append(f"trainer      {t.get('version', '?')}: {t.get('steps', 0)} steps "
                     f"({t.get('trained_steps', 0)} trained), {t.get('groups_done', 0)} groups done, "
                     f"left out: {left}; last progress {_ago(t['updated_s_ago'])}")
    newest = summary["newest_version"]
    lines.append(f"newest       {newest['version']} ({_ago(newest['age_s'])})" if newest else "newest       none")
    promotion = summary["last_promotion"]
    lines.append(f"stable       {summary['stable'] or '?'}; last promotion "
                 + (f"{promotion['version']} {_ago(promotion['age_s'])}" if promotion else "never"))
    canary = summary["canary"]
    if canary:
        arm, stable = canary["canary_arm"], canary["stable_arm"]
        lines.append(f"canary       {canary['version']} at {canary['percent']} % since {_ago(canary['since_s'])}: "
                     f"{arm.get('samples', 0)} trajectories ({arm.get('reward_samples', 0)} rewarded) against "
                     f"{stable.get('samples', 0)} ({stable.get('reward_samples', 0)}) "
                     + ("now" if canary["live"] else "at its last step (--rollout-metrics: now)"))
    else:
        lines.append("canary       none")
    last = summary["last_decision"]
    if last:
        lines.append(f"last         {last['action']} {last['version']} {_ago(last['age_s'])}: {last['reason'][:160]}")
    lines += [f"ALARM        {a}" for a in summary["alarms"]] or ["alarms       none"]
    return "\n".join(lines)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def read(bus, timeout_s: float = 10.0) -> dict[str, list[Seen]]:
    """Each topic's records, up to its end when read: trainer.progress and planner.versions whole (compacted: one
    record per key), rollout.decisions from its newest DECISIONS_READ per partition."""
    from kafka import TopicPartition

    from agentflow.bus import topics
    from agentflow.bus.clients import BusUnavailable, assigned_consumer
    from agentflow.bus.codec import DecodeError, decode

    names = {topics.TRAINER_PROGRESS: "trainer_progress", topics.PLANNER_VERSIONS: "planner_version",
             topics.ROLLOUT_DECISIONS: "rollout_decision"}
    found: dict[str, list[Seen]] = {name: [] for name in names}
    consumer = None
    try:
        consumer = assigned_consumer(bus, [bus.topic(n) for n in names], client_id="agentflow-status",
                                     timeout_s=timeout_s, enable_auto_commit=False)
        ends = consumer.end_offsets(list(consumer.assignment()))
        for tp, end in ends.items():
            if tp.topic == bus.topic(topics.ROLLOUT_DECISIONS) and end > DECISIONS_READ:
                consumer.seek(TopicPartition(tp.topic, tp.partition), end - DECISIONS_READ)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end for tp, end in ends.items()) and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                logical = next(n for n in names if bus.topic(n) == tp.topic)
                for message in messages:
                    try:
                        envelope = decode(message.value)
                    except DecodeError:
                        continue
                    if envelope.HasField(names[logical]):
                        payload = _plain(getattr(envelope, names[logical]))
                        found[logical].append(Seen(envelope.produced_at_unix_ms or message.timestamp, payload))
    except BusUnavailable as e:
        raise InvalidInput(f"{e}: is the ring running, and its broker at {bus.bootstrap_servers}?") from None
    finally:
        if consumer is not None:
            consumer.close(autocommit=False)
    for records in found.values():
        records.sort(key=lambda s: s.at_ms)
    return {"progress": found[topics.TRAINER_PROGRESS], "versions": found[topics.PLANNER_VERSIONS],
            "decisions": found[topics.ROLLOUT_DECISIONS]}


def _plain(message) -> dict:
    """``message`` as a dict with its 64-bit integers as ints (protobuf's JSON form writes them as text); other
    text stays text, whatever it looks like."""
    from google.protobuf.descriptor import FieldDescriptor

    from agentflow.domain.convert import to_dict

    wide = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)

    def numbers(descriptor, data: dict) -> dict:
        for field in descriptor.fields:
            if field.name not in data:
                continue
            value, kind = data[field.name], field.message_type
            if kind is not None and kind.GetOptions().map_entry:  # a map: its values by the entry's value field
                inner = kind.fields_by_name["value"]
                data[field.name] = {k: convert(inner, v) for k, v in value.items()}
            elif field.is_repeated:
                data[field.name] = [convert(field, v) for v in value]
            else:
                data[field.name] = convert(field, value)
        return data

    def convert(field, value):
        if field.message_type is not None and isinstance(value, dict):
            return numbers(field.message_type, value)
        return int(value) if field.cpp_type in wide and isinstance(value, str) else value

    return numbers(message.DESCRIPTOR, to_dict(message))


def status(args) -> int:
    """The `agentflow status` command."""
    import json
    import os

    from agentflow.bus.config import BusConfig
    from agentflow.config import from_env

    bootstrap = args.bootstrap or os.environ.get("AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS") or _running_broker()
    if not bootstrap:
        raise InvalidInput("no broker: give --bootstrap HOST:PORT (or AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS), or start "
                           "agentflow up")
    bus = from_env(BusConfig, "KAFKA_", flags={"bootstrap_servers": bootstrap})
    seen = read(bus, args.timeout)
    live = scrape(args.rollout_metrics, args.timeout) if args.rollout_metrics else None
    summary = summarize(seen["progress"], seen["versions"], seen["decisions"], int(time.time() * 1000), live)
    print(json.dumps(summary) if args.json else render(summary))
    return 1 if summary["alarms"] and args.fail_on_alarm else 0


def _running_broker() -> str:
    from agentflow.services.cluster import running_state

    return running_state().get("kafka", "")


def add_parser(commands) -> None:
    from agentflow import cli_args

    parser = commands.add_parser("status", help="where the training loop stands: the trainer's last step, the "
                                                "newest and the stable version, the canary, alarms")
    parser.add_argument("--bootstrap", type=cli_args.addresses,
                        help="Kafka bootstrap servers (default: AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS, else the broker "
                             "of a running agentflow up)")
    parser.add_argument("--rollout-metrics", type=cli_args.address,
                        help="the rollout controller's metrics host:port: the running canary's counts now")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--timeout", type=cli_args.number(0, lo_open=True), default=10.0,
                        help="seconds to reach the broker and read (default 10)")
    parser.add_argument("--fail-on-alarm", action="store_true", help="exit 1 when an alarm is raised")
    parser.set_defaults(handler=status)
