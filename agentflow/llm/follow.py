"""`serve-llm --follow-versions`: load each planner version the trainer announces.

``promote`` mode (the learning bench) sends it all traffic at once: always serve the newest policy, so rollouts stay
close to on-policy. ``load`` mode (with a rollout controller, `agentflow demo`) only loads it: production traffic
follows the controller's canary weights, while training rollouts pin ``latest``. The previous idle version stays
loaded for the trajectories that started on it; older idle ones are unloaded, unless called in the last
``UNUSED_S`` seconds (``load`` mode: a version the controller drains after a rollback).
"""

from __future__ import annotations

import json
import logging
import threading

from agentflow.bus import topics
from agentflow.bus.clients import Follower
from agentflow.bus.config import BusConfig
from agentflow.llm.versions import VersionError, Versions
from agentflow.versions import newest_announcement, parse_version

log = logging.getLogger(__name__)
#: ``load`` mode: a version called this recently is not idle (the controller's drain_s, 150 s, plus a query's 120)
UNUSED_S = 300.0


def follow_versions(versions: Versions, bus: BusConfig, stop: threading.Event, *, promote: bool = True,
                    keep: int = 1, unused_s: float = 0.0, poll_s: float = 0.5) -> None:
    """Until ``stop``: read ``planner.versions`` from the beginning and load each newer version; with ``promote``
    it takes all traffic at once, else the weights stay as they are (a rollout controller sets them; calls pinned
    to ``latest`` — training rollouts — use it). Idle versions but the ``keep`` newest are unloaded; a version called
    in the last ``unused_s`` seconds is not idle (a controller drains a withdrawn version with weight 0: the
    trajectories on it must find it)."""
    serving = max((parse_version(n) or -1 for n in versions.names()), default=-1)

    def load_newest(records) -> None:
        nonlocal serving
        newest = newest_announcement(records)
        if newest is None or newest[0] <= serving:
            return
        number, name, uri = newest
        try:
            if name not in versions.names():
                versions.add(name, uri)
            if promote:
                versions.set_weights({name: 100})
            dropped = versions.prune(keep, unused_s=unused_s)
            serving = number
            log.info("now serving %s (unloaded %s)", name, ", ".join(dropped) or "nothing")
            print(json.dumps({"event": "serving", "version": name, "uri": uri}), flush=True)
        except VersionError as e:  # a bad checkpoint: keep serving what we have, wait for the next one
            log.error("cannot serve %s: %s", name, e)
            serving = number

    Follower(bus, [topics.PLANNER_VERSIONS], load_newest, per_batch=True, stop=stop, name="follow-versions",
             poll_s=poll_s, wait_s=30, on_connect=lambda: topics.ensure_topics(bus, [topics.PLANNER_VERSIONS])).run()
