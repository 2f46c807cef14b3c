"""Planner versions: the contract between the trainer, which makes them, and the LLM servers and rollouts, which use
them. Both sides import this module; neither imports the other.

* A version's name is ``v`` and its number in six digits (``version_name(12) == "v000012"``); ``parse_version``
  reads that and the other spellings a version arrives in back to its number. Any name a server or a rollout
  backend is given passes ``check_version_name``: it ends up in URL paths and HTTP headers.
* A checkpoint is a model folder with ``CHECKPOINT_METADATA`` in it, written last: a folder without it is not (yet)
  a version.
* Each new version is announced on ``planner.versions``; ``newest_announcement`` finds the newest in what a reader
  polled.
* A version the rollout controller rolled back because a tripwire fired (``agentflow.rollout.tripwires``) is
  quarantined: the trainer does not train on the groups it served (``quarantined_version`` reads that from a
  ``rollout.decisions`` event).

(``agentflow/llm/versions.py`` is something else: the set of versions one LLM server has loaded.)
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from agentflow.bus.codec import DecodeError
from agentflow.errors import InvalidInput

log = logging.getLogger(__name__)

CHECKPOINT_METADATA = "agentflow.json"  # a checkpoint's metadata, and the marker that it is complete
#: ``RolloutComparison.verdict`` of a tripwire that fired (its metric is ``tripwire:<name>``)
TRIPPED = "tripped"
_TRAILING_NUMBER = re.compile(r"^\D*(\d+)$")
MAX_VERSION_NAME = 128
_VERSION_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_VERSION_NAME - 1}}}")


def version_name(number: int) -> str:
    """The name of version ``number``: ``v000012``."""
    return f"v{number:06d}"


def check_version_name(name) -> str:
    """``name`` if it can name a version: 1 to ``MAX_VERSION_NAME`` characters of ``A-Za-z0-9._:-``, the first a
    letter or digit (no CR/LF, control, space, non-ASCII or ``/``: a name goes into URL paths and HTTP headers);
    ``InvalidInput`` otherwise."""
    if not isinstance(name, str) or not _VERSION_NAME.fullmatch(name):
        shown = name[:MAX_VERSION_NAME + 1] if isinstance(name, str) else name
        raise InvalidInput(f"a version name must be 1 to {MAX_VERSION_NAME} characters of A-Z a-z 0-9 . _ : - "
                           f"starting with a letter or digit, got {shown!r}")
    return name


def parse_version(version) -> int | None:
    """A policy version as an integer: ``3``, ``"3"``, ``"v3"``, ``"planner-v12"``, ``"step-000012"`` -> 3, 3, 3, 12,
    12.

    Strings are read as their trailing digits after a prefix without digits; anything else (``""``, ``"tiny"``,
    ``"v1.2"``, booleans) is None: unknown version.
    """
    if isinstance(version, bool):
        return None
    if isinstance(version, int):
        return version
    if isinstance(version, float) and version.is_integer():
        return int(version)
    if isinstance(version, str):
        match = _TRAILING_NUMBER.match(version.strip())
        return int(match.group(1)) if match else None
    return None


def newest_announcement(records) -> tuple[int, str, str] | None:
    """``(number, name, checkpoint_uri)`` of the newest version among ``planner.versions`` records (anything with
    ``envelope()``, such as ``bus.clients.Received``); None when none names a readable version and a checkpoint."""
    best = None
    for record in records:
        try:
            event = record.envelope().planner_version
        except DecodeError:
            log.warning("skipping an undecodable record at %s/%d@%d", record.topic, record.partition, record.offset)
            continue
        number = parse_version(event.version)
        if number is not None and event.checkpoint_uri and (best is None or number > best[0]):
            best = (number, event.version, event.checkpoint_uri)
    return best


DRAINING = 4  # withdrawn versions Served keeps


@dataclass(frozen=True)
class Served:
    """The versions the rollout controller serves, as its decisions (``agentflow.v1.RolloutDecision``) tell: the
    stable one, the canary, and the last ``DRAINING`` that a promotion or a rollback withdrew (their trajectories
    finish on them). What the trainer never prunes from its store."""

    stable: int | None = None
    canary: int | None = None
    draining: frozenset[int] = frozenset()

    def after(self, decision) -> Served:
        version, stable = parse_version(decision.version), parse_version(decision.stable_version)
        stable = self.stable if stable is None else stable
        if decision.action in ("canary", "step"):
            return Served(stable, version, self.draining)
        if decision.action == "promote":
            return Served(version, None, self._withdraw(self.stable, stable))
        if decision.action in ("rollback", "reject"):
            return Served(stable, None, self._withdraw(self.canary, version))
        return replace(self, stable=stable)  # queue, skip: the canary goes on

    def _withdraw(self, *versions: int | None) -> frozenset[int]:
        return frozenset(sorted(self.draining | {v for v in versions if v is not None})[-DRAINING:])

    def versions(self) -> frozenset[int]:
        return frozenset(v for v in (self.stable, self.canary) if v is not None) | self.draining


def quarantined_version(decision) -> str:
    """The version an ``agentflow.v1.RolloutDecision`` rolled back because a tripwire fired (a comparison with the
    verdict ``TRIPPED``), or "" for any other decision."""
    if decision.action == "rollback" and any(c.verdict == TRIPPED for c in decision.comparisons):
        return decision.version
    return ""
