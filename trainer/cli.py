"""`agentflow train` and `agentflow drive`: flags over ``TrainerSettings`` / ``DriveSettings`` (each flag is also an
AGENTFLOW_TRAINER_* / AGENTFLOW_DRIVE_* variable; a flag wins)."""

from __future__ import annotations

from dataclasses import fields, replace

from agentflow.bus.config import BusConfig
from agentflow.config import from_env


def _add_settings_flags(parser, settings_class) -> None:
    for f in fields(settings_class):
        kind = {"int": int, "float": float}.get(str(f.type), str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, dest=f.name,
                            help=f"{f.metadata.get('help', '')} (default {f.default!r})")


def _settings(settings_class, prefix: str, args):
    chosen = {f.name: getattr(args, f.name) for f in fields(settings_class) if getattr(args, f.name) is not None}
    return replace(from_env(settings_class, prefix), **chosen)


def _bus(args) -> BusConfig:
    bus = BusConfig.from_env()
    return replace(bus, bootstrap_servers=args.bootstrap) if args.bootstrap else bus


def _train(args) -> int:
    from agentflow.trainer.service import TrainerSettings, serve_trainer

    serve_trainer(_settings(TrainerSettings, "TRAINER_", args), _bus(args))
    return 0


def _drive(args) -> int:
    import threading

    from agentflow.runtime import on_stop_signal
    from agentflow.trainer.drive import DriveSettings, drive

    stop = threading.Event()
    on_stop_signal(stop.set)
    result = drive(_settings(DriveSettings, "DRIVE_", args), stop=stop, progress=lambda line: print(line, flush=True))
    return 0 if result["answered"] or not result["sent"] else 1


def add_parsers(commands) -> None:
    from agentflow.trainer.drive import DriveSettings
    from agentflow.trainer.service import TrainerSettings

    train = commands.add_parser("train", help="run the Flow-GRPO trainer: consume trajectories, publish versions")
    train.add_argument("--bootstrap", help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    _add_settings_flags(train, TrainerSettings)
    train.set_defaults(handler=_train)

    drive = commands.add_parser("drive", help="send training queries G times each through the gateway")
    _add_settings_flags(drive, DriveSettings)
    drive.set_defaults(handler=_drive)
