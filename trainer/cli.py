"""`agentflow train` and `agentflow drive`: flags over ``TrainerSettings`` / ``DriveSettings`` (each flag is also an
AGENTFLOW_TRAINER_* / AGENTFLOW_DRIVE_* variable; a flag wins)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import fields, replace

from agentflow.bus.config import BusConfig
from agentflow.config import flag_name, from_env


def _add_settings_flags(parser, settings_class, defaults=None, path: str = "") -> None:
    """One flag per field (``--name``, dest ``name``), and per field of a group (``--grpo-lr``, dest ``grpo.lr``);
    text flags are converted by ``from_env`` like the environment's values."""
    defaults = settings_class() if defaults is None else defaults
    hints = typing.get_type_hints(settings_class)
    for f in fields(settings_class):
        kind, default = hints[f.name], getattr(defaults, f.name)
        if dataclasses.is_dataclass(kind):
            _add_settings_flags(parser, kind, default, f"{path}{f.name}.")
            continue
        parser.add_argument(flag_name(path + f.name), type=kind if kind in (int, float) else str, dest=path + f.name,
                            metavar=f.name.upper(), help=f"{f.metadata.get('help', '')} (default {default!r})")


def _settings(settings_class, prefix: str, args):
    return from_env(settings_class, prefix, flags=vars(args))


def _bus(args) -> BusConfig:
    bus = BusConfig.from_env()
    return replace(bus, bootstrap_servers=args.bootstrap) if args.bootstrap else bus


def _train(args) -> int:
    from agentflow.trainer.service import serve_trainer, trainer_settings

    serve_trainer(trainer_settings(flags=vars(args)), _bus(args))
    return 0


def _drive(args) -> int:
    import threading

    from agentflow.services.runtime import on_stop_signal
    from agentflow.trainer.drive import DriveSettings, drive

    stop = threading.Event()
    on_stop_signal(stop.set)
    result = drive(_settings(DriveSettings, "DRIVE_", args), stop=stop, progress=lambda line: print(line, flush=True))
    return 0 if result["answered"] or not result["sent"] else 1


def add_parsers(commands) -> None:
    from agentflow.trainer.drive import DriveSettings
    from agentflow.trainer.service import OLD_GRPO_NAMES, TrainerSettings

    train = commands.add_parser("train", help="run the Flow-GRPO trainer: consume trajectories, publish versions")
    train.add_argument("--bootstrap", help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    _add_settings_flags(train, TrainerSettings)
    for old in OLD_GRPO_NAMES:  # the names of before --grpo-*: read (with a warning) until the next release
        train.add_argument(flag_name(old), dest=old, help=argparse.SUPPRESS)
    train.set_defaults(handler=_train)

    drive = commands.add_parser("drive", help="send training queries G times each through the gateway")
    _add_settings_flags(drive, DriveSettings)
    drive.set_defaults(handler=_drive)
