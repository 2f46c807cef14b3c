"""Typed settings, validated once at start-up. Environment variables and CLI flags map onto the same fields.

A settings class is a frozen dataclass whose fields are declared with ``setting(default, help)``. Each field can be
set from ``AGENTFLOW_<PREFIX><FIELD>`` (upper case), e.g. ``AGENTFLOW_ENDPOINT`` or ``AGENTFLOW_PLANNER_ENDPOINT``,
and from a CLI flag (``from_env(..., flags=...)``); a field that is itself a settings dataclass is a group, read from
``AGENTFLOW_<PREFIX><GROUP>_<FIELD>`` (e.g. ``AGENTFLOW_TRAINER_GRPO_LR``). Nothing is read at import time.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field, fields, replace

from agentflow.errors import InvalidInput

ENGINE_KINDS = ("embedded", "openai")
_NONE_WORDS = ("", "none", "null")  # what an optional setting's text may be to mean None


def setting(default, help: str, **kw):
    """A settings field: its default and its help text (shown by the CLI flag and the docs). ``kw`` goes to
    ``dataclasses.field`` (e.g. ``repr=False`` for a secret)."""
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class EngineSettings:
    engine: str = setting("embedded", "embedded (in-process transformers) or openai (HTTP)")
    model: str = setting("", "embedded: a model folder (empty or 'smollm2': SmolLM2-135M-Instruct); openai: the "
                             "served model name (empty: the first one the server lists)")
    endpoint: str = setting("", "openai: base URL including /v1")
    api_key: str = setting("", "openai: bearer token")
    timeout_s: float = setting(120.0, "per call; the query's deadline may cut it shorter")
    retries: int = setting(2, "openai: extra attempts on connection errors and 429/5xx")
    max_batch: int = setting(8, "embedded: requests generated together")
    dtype: str = setting("float32", "embedded: float32 (logprobs match the trainer's), bfloat16 (about 2x faster "
                                    "on CPUs with AVX512-BF16 or AMX) or auto (bfloat16 where the CPU has them: "
                                    "for inference only, e.g. agentflow run)")
    routing: str = setting("", "openai: follow this deployment's routing table on planner.routing (the rollout "
                               "controller's; keeps each trajectory on one version); empty: call endpoint only")
    routing_endpoints: tuple[str, ...] = setting((), "openai with routing: URL patterns (fnmatch) a routing table "
                                                     "may send calls to; empty: endpoint's own origin only")

    def __post_init__(self):
        if self.engine not in ENGINE_KINDS:
            raise InvalidInput(f"engine must be one of {', '.join(ENGINE_KINDS)}, got {self.engine!r}")
        if self.engine == "openai" and not self.endpoint:
            raise InvalidInput("engine 'openai' needs an endpoint (--endpoint or AGENTFLOW_ENDPOINT)")
        if self.routing and self.engine != "openai":
            raise InvalidInput("routing by a routing table needs engine 'openai' (AGENTFLOW_PLANNER_ENGINE)")
        if self.dtype not in ("float32", "bfloat16", "auto"):
            raise InvalidInput(f"dtype must be float32, bfloat16 or auto, got {self.dtype!r}")
        if self.timeout_s <= 0 or self.retries < 0 or self.max_batch < 1:
            raise InvalidInput("timeout_s must be positive, retries at least 0 and max_batch at least 1")


def from_env(cls, prefix: str = "", base=None, environ: typing.Mapping[str, str] | None = None,
             flags: typing.Mapping[str, object] | None = None):
    """``base`` (or the defaults) with every field overridden by its AGENTFLOW_<PREFIX><FIELD> variable, if set,
    then by ``flags`` (field name -> value, e.g. parsed CLI flags; None = not given; a group's fields as
    ``"group.field"``). Text is converted to the field's type; a bad value is an ``InvalidInput`` naming its variable
    or flag. The result is validated once, with everything applied (a flag may complete the environment)."""
    environ = os.environ if environ is None else environ
    return _read(cls, prefix, base if base is not None else cls(), environ, flags or {}, "")


def _read(cls, prefix: str, base, environ, flags, path: str):
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):  # a group: AGENTFLOW_<PREFIX><GROUP>_<FIELD>, flags "group.field"
            values[f.name] = _read(kind, f"{prefix}{f.name}_", getattr(base, f.name), environ, flags,
                                   f"{path}{f.name}.")
            continue
        name = f"AGENTFLOW_{prefix}{f.name}".upper()
        flag = flags.get(path + f.name)
        if flag is not None:
            values[f.name] = _convert(flag, kind, flag_name(path + f.name)) if isinstance(flag, str) else flag
        elif name in environ:
            values[f.name] = _convert(environ[name], kind, name)
    return replace(base, **values) if values else base


def flag_name(name: str) -> str:
    """The CLI flag of a field (``"grpo.lr"`` -> ``--grpo-lr``)."""
    return "--" + name.replace(".", "-").replace("_", "-")


def _convert(text: str, kind, name: str):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:  # X | None
        return None if text.strip().lower() in _NONE_WORDS else _convert(text, args[0], name)
    try:
        if kind is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if kind in (int, float, str):
            return kind(text)
        if typing.get_origin(kind) is tuple:
            return tuple(part.strip() for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidInput(f"{name}={text!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    raise InvalidInput(f"{name} cannot be set from the environment")


def help_text(cls) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
