"""`agentflow fleet-mirror`: copies of a remote model store's newest versions in a local folder, for a server that
loads versions from folders only.

The full-weight rollout fleet (``agentflow.rollout.vllm_fleet``) replaces a vLLM's weights from a version's folder.
With the model store on a claim the fleet's pod mounts it; with an object store (``s3://...``) this mirror runs
beside the vLLM (a sidecar sharing one ``emptyDir``) and keeps ``<into>/<version>`` for the base (``v000000``, the
weights vLLM starts from) and the newest ``keep`` committed versions; the rollout controller loads
``<fleet_mirror>/<version>`` once it is there. Each folder is downloaded beside its final name and renamed into
place (``agentflow.storage.download``), so whoever sees a folder sees all of it; versions that fell out are deleted.

It reads the store itself (a version is committed once its ``agentflow.json`` is written last), not the
announcements on ``planner.versions``: nothing outside the store can make it download anything else.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from agentflow.errors import InvalidInput
from agentflow.trainer.checkpoint import ModelStore
from agentflow.versions import parse_version, version_name

log = logging.getLogger(__name__)
BASE = 0  # the version the fleet's vLLM starts from


def wanted_versions(versions: list[int], keep: int) -> list[int]:
    """The base, then the newest ``keep`` versions newest first: the order they are fetched in."""
    newest = sorted(versions, reverse=True)[:keep]
    return ([BASE] if BASE in versions and BASE not in newest else []) + newest


def mirror_once(store: ModelStore, into: Path, keep: int) -> list[str]:
    """Fetch the wanted versions that ``into`` lacks, then delete the others; returns the names fetched."""
    wanted = wanted_versions(store.versions(), keep)
    fetched = []
    for version in wanted:
        target = into / version_name(version)
        if not target.is_dir():
            store.download(version, target)
            fetched.append(target.name)
            log.info("mirrored %s into %s", target.name, target)
    names = {version_name(v) for v in wanted}
    for old in into.iterdir() if wanted else ():
        if parse_version(old.name) is not None and old.name not in names:
            shutil.rmtree(old, ignore_errors=True)
    return fetched


def mirror_store(store: ModelStore, into: Path, *, keep: int, stop: threading.Event, poll_s: float = 10.0) -> None:
    """Until ``stop``: ``mirror_once`` every ``poll_s`` seconds. A store that cannot be read is tried again."""
    if keep < 1:
        raise InvalidInput(f"the mirror keeps at least one version besides the base, got keep={keep}")
    into.mkdir(parents=True, exist_ok=True)
    while not stop.is_set():
        try:
            mirror_once(store, into, keep)
        except Exception as e:  # noqa: BLE001 - an unreachable or refusing store (each backend has its errors)
            log.warning("model store %s: %s (trying again in %.0f s)", store.uri, e, poll_s)
        stop.wait(poll_s)
