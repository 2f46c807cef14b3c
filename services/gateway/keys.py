"""Who calls the gateway, and what they may do: API keys with a name and scopes, stored hashed (docs/deploy.md,
"API keys").

An entry is ``NAME:SCOPE+SCOPE:sha256:HEX`` (``agentflow keys new NAME --scopes ...`` makes a key and its entry); the
gateway keeps only the SHA-256 of each key, so the Secret that holds the entries never holds a usable key. A key is
32 random bytes, so an unsalted hash is enough: there is nothing to guess. An entry that is not in this form is an
older plain-text key: it keeps working with the scopes ``solve`` and ``feedback`` (a warning says to replace it).

Scopes:

* ``solve``: ``Solve`` and ``SolveStream`` of production traffic;
* ``feedback``: rate the trajectories this key asked for (``Feedback``);
* ``train``: what teaches the planner directly: ``source`` other than ``traffic``, a ``group_id``, a ``ground_truth``
  (the rollout driver's key);
* ``review``: rate any trajectory, not only its own (a labelling team);
* ``delegate``: the key speaks for many people (an application's backend): its ``labeller`` names the person, and
  each person counts as a rater of their own (``NAME/LABELLER``). Without it the labeller is a note, never an
  identity: every rating of the key counts as the one rater ``NAME``.

Without any entry (a gateway on loopback, or ``allow_anonymous``), every caller is ``anonymous`` with
``anonymous_scopes``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass

from agentflow.errors import AgentFlowError, InvalidInput, Reason

log = logging.getLogger(__name__)
SCOPES = ("solve", "feedback", "train", "review", "delegate")
LEGACY_SCOPES = frozenset({"solve", "feedback"})
ANONYMOUS = "anonymous"
MAX_KEY_CHARS = 256  # a presented key longer than this is refused before it is hashed
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENTRY = re.compile(r"(?P<name>[^:]+):(?P<scopes>[^:]+):sha256:(?P<digest>[0-9a-f]{64})")


class Unauthenticated(AgentFlowError):
    reason = Reason.UNAUTHENTICATED


class PermissionDenied(AgentFlowError):
    reason = Reason.PERMISSION_DENIED


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the key's name and what it may do."""

    name: str
    scopes: frozenset[str]

    def require(self, scope: str, what: str) -> None:
        if scope not in self.scopes:
            raise PermissionDenied(f"the key {self.name!r} may not {what}: that needs the scope {scope!r} "
                                   f"(it has {', '.join(sorted(self.scopes)) or 'none'})")


@dataclass(frozen=True)
class KeyEntry:
    name: str
    scopes: frozenset[str]
    digest: bytes  # SHA-256 of the key


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def check_scopes(names) -> frozenset[str]:
    scopes = frozenset(s.strip() for s in names if s.strip())
    if unknown := scopes - set(SCOPES):
        raise InvalidInput(f"unknown scope(s) {', '.join(sorted(unknown))}; known: {', '.join(SCOPES)}")
    return scopes


def parse_entry(text: str) -> KeyEntry:
    """One configured key (the module docstring's form, or a legacy plain-text key)."""
    text = text.strip()
    match = _ENTRY.fullmatch(text)
    if match is None:
        if not text:
            raise InvalidInput("an API key entry is empty")
        name = "key-" + hashlib.sha256(text.encode()).hexdigest()[:8]
        log.warning("gateway: API key %s is stored in plain text; it gets the scopes solve and feedback. Replace it "
                    "with a hashed entry (agentflow keys new NAME --scopes ...)", name)
        return KeyEntry(name, LEGACY_SCOPES, digest(text))
    name = match["name"]
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"API key name {name[:80]!r} must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or "
                           "digit)")
    return KeyEntry(name, check_scopes(match["scopes"].split("+")), bytes.fromhex(match["digest"]))


class KeyRing:
    """The configured keys; ``caller(presented)`` says who calls."""

    def __init__(self, entries, anonymous_scopes=("solve", "feedback")):
        self.entries = [parse_entry(e) for e in entries]
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise InvalidInput(f"API key names must be unique, got {sorted(names)}")
        self.anonymous = Caller(ANONYMOUS, check_scopes(anonymous_scopes))

    def caller(self, presented: str) -> Caller:
        if not self.entries:
            return self.anonymous
        if not presented or len(presented) > MAX_KEY_CHARS:
            raise Unauthenticated("missing or unknown x-api-key")
        wanted = digest(presented)
        found = None
        for entry in self.entries:  # every entry compared, in constant time
            if hmac.compare_digest(wanted, entry.digest):
                found = entry
        if found is None:
            raise Unauthenticated("missing or unknown x-api-key")
        return Caller(found.name, found.scopes)


def new_key(name: str, scopes) -> tuple[str, str]:
    """A fresh random key and its entry (only the entry goes into the gateway's configuration)."""
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"the key name must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit), got {name!r}")
    scopes = check_scopes(scopes)
    if not scopes:
        raise InvalidInput(f"--scopes needs at least one of {', '.join(SCOPES)}")
    key = "afk_" + secrets.token_urlsafe(32)
    entry = f"{name}:{'+'.join(s for s in SCOPES if s in scopes)}:sha256:{digest(key).hex()}"
    return key, entry
