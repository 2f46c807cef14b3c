"""Typed settings, validated once at start-up. Environment variables and CLI flags map onto the same fields.

Each field of a settings dataclass can be set from ``AGENTFLOW_<PREFIX><FIELD>`` (upper case), e.g.
``AGENTFLOW_ENDPOINT`` or ``AGENTFLOW_PLANNER_ENDPOINT``. Nothing is read at import time.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field, fields, replace

from agentflow.errors import InvalidInput

ENGINE_KINDS = ("embedded", "openai")


@dataclass(frozen=True)
class EngineSettings:
    engine: str = field(default="embedded", metadata={"help": "embedded (in-process transformers) or openai (HTTP)"})
    model: str = field(default="", metadata={
        "help": "embedded: a model folder (empty or 'smollm2': SmolLM2-135M-Instruct); openai: the served model name "
                "(empty: the first one the server lists)"})
    endpoint: str = field(default="", metadata={"help": "openai: base URL including /v1"})
    api_key: str = field(default="", metadata={"help": "openai: bearer token"})
    timeout_s: float = field(default=120.0, metadata={"help": "per call; the query's deadline may cut it shorter"})
    retries: int = field(default=2, metadata={"help": "openai: extra attempts on connection errors and 429/5xx"})
    max_batch: int = field(default=8, metadata={"help": "embedded: requests generated together"})
    dtype: str = field(default="float32", metadata={
        "help": "embedded: float32 (logprobs match the trainer's) or bfloat16 (about 2x faster on CPUs with AVX512-BF16)"})

    def __post_init__(self):
        if self.engine not in ENGINE_KINDS:
            raise InvalidInput(f"engine must be one of {', '.join(ENGINE_KINDS)}, got {self.engine!r}")
        if self.engine == "openai" and not self.endpoint:
            raise InvalidInput("engine 'openai' needs an endpoint (--endpoint or AGENTFLOW_ENDPOINT)")
        if self.dtype not in ("float32", "bfloat16"):
            raise InvalidInput(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.timeout_s <= 0 or self.retries < 0 or self.max_batch < 1:
            raise InvalidInput("timeout_s must be positive, retries at least 0 and max_batch at least 1")


def from_env(cls, prefix: str = "", base=None, environ: typing.Mapping[str, str] | None = None):
    """``base`` (or the defaults) with every field overridden by its AGENTFLOW_<PREFIX><FIELD> variable, if set."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        name = f"AGENTFLOW_{prefix}{f.name}".upper()
        if name in environ:
            values[f.name] = _convert(environ[name], hints[f.name], name)
    base = base if base is not None else cls()
    return replace(base, **values) if values else base


def _convert(text: str, kind, name: str):
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
