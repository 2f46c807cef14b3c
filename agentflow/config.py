"""Typed settings, validated once at start-up. Environment variables and CLI flags map onto the same fields.

A settings class is a frozen dataclass whose fields are declared with ``setting(default, help)``. Each field can be
set from ``AGENTFLOW_<PREFIX><FIELD>`` (upper case), e.g. ``AGENTFLOW_ENDPOINT`` or ``AGENTFLOW_PLANNER_ENDPOINT``,
and from a CLI flag (``from_env(..., flags=...)``); a field that is itself a settings dataclass is a group, read from
``AGENTFLOW_<PREFIX><GROUP>_<FIELD>`` (e.g. ``AGENTFLOW_TRAINER_GRPO_LR``). A TOML file (``read_config``, the
commands' ``--config``) may set them too: keys are the field names, a group is a table (``[grpo]`` with ``lr = 1e-5``).
Precedence: defaults < environment < config file < flags. Nothing is read at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields, replace

from agentflow import cli_args
from agentflow.errors import InvalidInput

ENGINE_KINDS = ("embedded", "openai")
_NONE_WORDS = ("", "none", "null")  # what an optional setting's text may be to mean None


def setting(default, help: str, check=None, group: str = "", **kw):
    """A settings field: its default, its help text (shown by the CLI flag and the docs), the ``type=`` checker
    of its CLI flag (``agentflow.cli_args``; default: by the field's type; a config file's value passes it too) and
    the title of the ``--help`` section its flag is listed in (``group_title``). ``kw`` goes to ``dataclasses.field``
    (e.g. ``repr=False`` for a secret)."""
    return field(default=default, metadata={"help": help, "check": check, "group": group}, **kw)


def group_title(cls, name: str, default: str = "settings") -> str:
    """The ``--help`` section of ``cls``'s field ``name``: its ``group``, else ``default``."""
    return next(f for f in fields(cls) if f.name == name).metadata.get("group") or default


def flag_check(cls, name: str):
    """The ``type=`` of the CLI flag of ``cls``'s field ``name``: its ``check``, else one by the field's type."""
    f = next(f for f in fields(cls) if f.name == name)
    if f.metadata.get("check"):
        return f.metadata["check"]
    kind = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:  # X | None
        return cli_args.optional(_check_of_type(args[0]))
    return _check_of_type(kind)


def _check_of_type(kind):
    return {int: cli_args.integer(), float: cli_args.number(), bool: cli_args.boolean}.get(kind, str)


@dataclass(frozen=True)
class EngineSettings:
    engine: str = setting("embedded", "embedded (in-process transformers) or openai (HTTP)")
    model: str = setting("", "embedded: a model folder (empty or 'smollm2': SmolLM2-135M-Instruct); openai: the "
                             "served model name (empty: the first one the server lists)")
    endpoint: str = setting("", "openai: base URL including /v1")
    api_key: str = setting("", "openai: bearer token")
    timeout_s: float = setting(120.0, "per call; the query's deadline may cut it shorter")
    retries: int = setting(2, "openai: extra attempts on connection errors and 429/5xx")
    priority_scheduling: bool = setting(False, "openai: the servers schedule by priority (vLLM's --scheduling-policy "
                                               "priority): training rollouts' calls are sent with a lower one, so "
                                               "users' are served first")
    max_batch: int = setting(8, "embedded: requests generated together")
    dtype: str = setting("float32", "embedded: float32 (logprobs match the trainer's), bfloat16 (about 2x faster "
                                    "on CPUs with AVX512-BF16 or AMX) or auto (bfloat16 where the CPU has them: "
                                    "for inference only, e.g. agentflow run)")
    routing: str = setting("", "openai: follow this deployment's routing table on planner.routing (the rollout "
                               "controller's; keeps each trajectory on one version); empty: call endpoint only")
    routing_endpoints: tuple[str, ...] = setting((), "openai with routing: URL patterns (fnmatch) a routing table "
                                                     "may send calls to; empty: endpoint's own origin only")
    routing_wait_s: float = setting(60.0, "openai with routing: the planner waits this long for its first routing "
                                          "table before it consumes and reports SERVING (then, until a table "
                                          "arrives, calls go to endpoint); 0: no wait")

    def __post_init__(self):
        if self.engine not in ENGINE_KINDS:
            raise InvalidInput(f"engine must be one of {', '.join(ENGINE_KINDS)}, got {self.engine!r}")
        if self.engine == "openai" and not self.endpoint:
            raise InvalidInput("engine 'openai' needs an endpoint (--endpoint or AGENTFLOW_ENDPOINT)")
        if self.routing and self.engine != "openai":
            raise InvalidInput("routing by a routing table needs engine 'openai' (AGENTFLOW_PLANNER_ENGINE)")
        if self.dtype not in ("float32", "bfloat16", "auto"):
            raise InvalidInput(f"dtype must be float32, bfloat16 or auto, got {self.dtype!r}")
        if self.routing_wait_s < 0:
            raise InvalidInput(f"routing_wait_s must be at least 0, got {self.routing_wait_s}")
        if self.timeout_s <= 0 or self.retries < 0 or self.max_batch < 1:
            raise InvalidInput("timeout_s must be positive, retries at least 0 and max_batch at least 1")


def from_env(cls, prefix: str = "", base=None, environ: typing.Mapping[str, str] | None = None,
             flags: typing.Mapping[str, object] | None = None, config: ConfigFile | None = None):
    """``base`` (or the defaults) with every field overridden by its AGENTFLOW_<PREFIX><FIELD> variable, if set,
    then by ``config`` (a file's values, ``read_config``), then by ``flags`` (field name -> value, e.g. parsed CLI
    flags; None = not given; a group's fields as ``"group.field"``). Text is converted to the field's type; a bad
    value is an ``InvalidInput`` naming its variable or flag. The result is validated once, with everything applied
    (a flag may complete the environment); where that fails, the message names the flags given as such
    (``--grpo-group-size``, not ``grpo.group_size``), and the config file where it gave a field the message names."""
    environ = os.environ if environ is None else environ
    flags = {path: value for path, value in (flags or {}).items() if value is not None}
    layers = {**(config.values if config else {}), **flags}  # a flag wins over the file
    try:
        return _read(cls, prefix, base if base is not None else cls(), environ, layers, "")
    except InvalidInput as e:  # a rule across fields: name the flags that gave them
        message = _name_flags(str(e), [path for path in _paths(cls) if path in flags])
        if config and any(_mentions(message, path) for path in config.values if path not in flags):
            message = f"{config.path}: {message}"
        raise InvalidInput(message) from None


def _mentions(message: str, path: str) -> bool:
    """Whether ``message`` names the field ``path`` (by its path or its own name, also inside a variable's name)."""
    return any(re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", message, re.IGNORECASE)
               for name in {path, path.rpartition(".")[2]})


def _paths(cls, path: str = "") -> list[str]:
    """Every field of ``cls`` as ``from_env``'s flags name it (``"grpo.lr"`` for a group's)."""
    hints, paths = typing.get_type_hints(cls), []
    for f in fields(cls):
        kind = hints[f.name]
        paths += _paths(kind, f"{path}{f.name}.") if dataclasses.is_dataclass(kind) else [path + f.name]
    return paths


def _name_flags(message: str, given: list[str]) -> str:
    """``message`` with each field in ``given`` (and a group's field by its own name, e.g. ``group_size`` for
    ``grpo.group_size``) written as its flag; only names with ``_`` or ``.``, which are not words of the prose."""
    for path in sorted(given, key=len, reverse=True):
        for name in {path, path.rpartition(".")[2]}:
            if "_" in name or "." in name:
                message = re.sub(rf"(?<![\w.-]){re.escape(name)}(?!\w)", flag_name(path), message)
    return message


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
        if path + f.name in flags:  # a flag's value, or the config file's (already checked; None: "none")
            flag = flags[path + f.name]
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


# --- config files ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigFile:
    """A TOML settings file, read and checked: ``values`` maps each key to its value as the field's flag would give
    it (a group's keys as ``"group.field"``), ready for ``from_env(..., config=)``."""

    path: str
    values: dict[str, object]


_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
               dict: "a table"}


def read_config(cls, path, extra: typing.Mapping[str, cli_args.Check] | None = None) -> ConfigFile:
    """The TOML file ``path`` as settings of ``cls``: keys are its field names, a group's in a table (``[grpo]``).
    ``extra``: top-level keys that are not fields (e.g. ``bootstrap``), with their checkers. Every value passes its
    flag's checker (``flag_check``); a problem is one ``InvalidInput`` naming the file and the key."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not TOML: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:  # its message ends with "(at line L, column C)"
        raise InvalidInput(f"{path}: not TOML: {e}") from None
    values: dict[str, object] = {}
    _check_table(cls, cls, table, path, "", dict(extra or {}), values)
    return ConfigFile(str(path), values)


def _check_table(root, cls, table: dict, path, prefix: str, extra: dict, values: dict) -> None:
    """Check ``table`` (the file's keys under ``prefix``, e.g. ``"grpo."``) against ``cls`` (``root``'s group there);
    fill ``values``."""
    hints, known = typing.get_type_hints(cls), {f.name: f for f in fields(cls)}
    for key, value in table.items():
        where = f"{path}: [{prefix.rstrip('.')}] {key}" if prefix else f"{path}: {key}"
        if key in extra:
            values[key] = _checked(value, str, extra[key], where)
        elif key not in known:
            raise InvalidInput(f"{where}: unknown key{_closest(root, prefix + key, extra)}")
        elif dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise InvalidInput(f"{where}: must be a table ([{prefix}{key}]), not {_toml_type(value)}")
            _check_table(root, hints[key], value, path, f"{prefix}{key}.", {}, values)
        else:
            values[prefix + key] = _checked(value, hints[key], flag_check(cls, key), where)


def _closest(cls, key: str, extra: dict) -> str:
    """`` (did you mean ...?)`` with the known key nearest to ``key`` (``"grpo.lrr"``; ``grpo_lr`` or ``lr`` at the
    top for ``[grpo] lr``), as a file writes it."""
    paths = _paths(cls)
    paths += [*dict.fromkeys(path.rpartition(".")[0] for path in paths if "." in path), *extra]  # tables, extras
    for spell in (lambda p: re.sub(r"[.-]", "_", p), lambda p: p.rpartition(".")[2].replace("-", "_")):
        known = {spell(path): path for path in reversed(paths)}  # the first path wins a shared spelling
        near = difflib.get_close_matches(spell(key), list(known), n=1, cutoff=0.75)
        if near:
            group, _, name = known[near[0]].rpartition(".")
            return f" (did you mean {f'[{group}] ' if group else ''}{name}?)"
    return " (keys are the settings' names; --help lists them as flags)"


def _checked(value, kind, check, where: str):
    """``value`` from the file as text for ``check`` (a flag's checker), and what that gives; else an error."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1
    try:
        text = _as_text(value, args[0] if optional else kind, optional)
    except TypeError as e:
        raise InvalidInput(f"{where}: must be {e}, not {_toml_type(value)}") from None
    try:
        return check(text)
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise InvalidInput(f"{where}: {e}") from None


def _as_text(value, kind, optional: bool) -> str:
    """The text a flag would carry for ``value``; a TypeError saying what ``kind`` needs where the TOML type does
    not fit (an integer is a fine float; an array is a comma-separated list; "none" is an optional's None)."""
    if optional and isinstance(value, str):
        return value
    if kind is bool:
        if isinstance(value, bool):
            return str(value).lower()
        raise TypeError("true or false")
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
            raise TypeError("an integer" if kind is int else "a number")
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return ",".join(str(v) for v in value)
    raise TypeError("a string (or an array of them)")


def _toml_type(value) -> str:
    name = next((name for kind, name in _TOML_TYPES.items() if isinstance(value, kind)), "a date or time")
    return f"{name} ({value!r})" if not isinstance(value, (dict, list)) else name


def config_flag(cls, extra: typing.Mapping[str, cli_args.Check] | None = None) -> cli_args.Check:
    """The ``type=`` of a ``--config FILE.toml`` flag: the file read and checked as settings of ``cls``
    (``read_config``), or the problem as a flag's refusal (one line, exit 2, before anything loads)."""

    def check(text: str) -> ConfigFile:
        try:
            return read_config(cls, text, extra)
        except InvalidInput as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return check


def add_config_flag(parser, cls, variables: str, example: str, extra=None,
                    keys: str = "a flag's name without -- and with _ for - is its key (max_steps = 10)") -> None:
    """``--config FILE.toml`` (``config_flag``), in a first ``--help`` section that states the precedence; ``keys``
    says how a flag's key is spelled."""
    section = cli_args.argument_group(parser, "config file", f"precedence: defaults < {variables} variables < the "
                                                             f"--config file < flags; e.g. {example}")
    hints = typing.get_type_hints(cls)
    tables = [f"[{f.name}] for --{f.name}-*" for f in fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    section.add_argument("--config", type=config_flag(cls, extra), metavar="FILE.toml",
                         help=f"settings from a TOML file: {keys}"
                              f"{'; tables: ' + ', '.join(tables) if tables else ''}")


def flag_or_file(args, name: str):
    """The flag ``name`` if given, else the value the ``--config`` file (``args.config``) gives it; None: neither."""
    value, config = getattr(args, name, None), getattr(args, "config", None)
    return value if value is not None or config is None else config.values.get(name)
