"""`agentflow train` and `agentflow drive`: flags over ``TrainerSettings`` / ``DriveSettings`` (each flag is also an
AGENTFLOW_TRAINER_* / AGENTFLOW_DRIVE_* variable and a key of the ``--config`` TOML file; a flag wins, then the file,
then the environment), listed by ``--help`` in sections that follow the settings' groups."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import fields, replace

from agentflow.bus.config import BusConfig
from agentflow.cli_args import addresses, argument_group, integer, number
from agentflow.config import add_config_flag, flag_check, flag_name, flag_or_file, from_env, group_title


def _add_settings_flags(parser, settings_class, defaults=None, path: str = "", title: str = "settings") -> None:
    """One flag per field (``--name``, dest ``name``), and per field of a group (``--grpo-lr``, dest ``grpo.lr``),
    each checked by its field's ``check`` (``agentflow.config.flag_check``) as it is parsed, and listed by ``--help``
    in its field's ``group`` section (``title`` if it has none; a group's fields: the group field's own section)."""
    defaults = settings_class() if defaults is None else defaults
    hints = typing.get_type_hints(settings_class)
    for f in fields(settings_class):
        kind, default = hints[f.name], getattr(defaults, f.name)
        if dataclasses.is_dataclass(kind):
            section = group_title(settings_class, f.name, f"{f.name} ({flag_name(path + f.name)}-*)")
            argument_group(parser, section, f"{f.metadata.get('help', '')}; in a --config file: the "
                                            f"[{path}{f.name}] table")
            _add_settings_flags(parser, kind, default, f"{path}{f.name}.", section)
            continue
        argument_group(parser, group_title(settings_class, f.name, title)).add_argument(
            flag_name(path + f.name), type=flag_check(settings_class, f.name), dest=path + f.name,
            metavar=f.name.upper(), help=f"{f.metadata.get('help', '')} (default {default!r})")


def _settings(settings_class, prefix: str, args):
    return from_env(settings_class, prefix, flags=vars(args), config=args.config)


def _bus(args) -> BusConfig:
    bus, bootstrap = BusConfig.from_env(), flag_or_file(args, "bootstrap")
    return replace(bus, bootstrap_servers=bootstrap) if bootstrap else bus


def _train(args) -> int:
    from agentflow.bus.clients import reach_brokers
    from agentflow.trainer.service import serve_trainer, trainer_settings

    settings, bus = trainer_settings(flags=vars(args), config=args.config), _bus(args)
    reach_brokers(bus)  # before the model loads
    serve_trainer(settings, bus)
    return 0


def _drive(args) -> int:
    import threading

    from agentflow.bus.clients import reach_brokers
    from agentflow.rpc.client import is_serving
    from agentflow.services.runtime import on_stop_signal
    from agentflow.startup import first_contact
    from agentflow.trainer.drive import DriveSettings, drive, drive_bus

    settings = _settings(DriveSettings, "DRIVE_", args)
    first_contact("the gateway", settings.gateway, lambda: is_serving(settings.gateway),
                  set_by="--gateway (or gateway in the --config file, or AGENTFLOW_DRIVE_GATEWAY)")
    if settings.from_traffic or settings.max_ahead_groups:
        reach_brokers(drive_bus(settings))
    stop = threading.Event()
    on_stop_signal(stop.set)
    result = drive(settings, stop=stop, progress=lambda line: print(line, flush=True))
    return 0 if result["answered"] or not result["sent"] else 1


def _fleet_mirror(args) -> int:
    import threading
    from pathlib import Path

    from agentflow.services.runtime import on_stop_signal
    from agentflow.storage import local_path
    from agentflow.trainer.checkpoint import ModelStore
    from agentflow.trainer.mirror import mirror_store

    if local_path(args.store) is not None:
        raise SystemExit(f"agentflow fleet-mirror: --store {args.store} is a local folder; mount it where the "
                         "server reads versions instead of mirroring it")
    stop = threading.Event()
    on_stop_signal(stop.set)
    mirror_store(ModelStore(args.store), Path(args.into), keep=args.keep, stop=stop, poll_s=args.poll_s)
    return 0


def add_parsers(commands) -> None:
    from agentflow.trainer.drive import DriveSettings
    from agentflow.trainer.grpo import GRPOConfig
    from agentflow.trainer.service import OLD_GRPO_NAMES, TrainerSettings

    train = commands.add_parser("train", help="run the Flow-GRPO trainer: consume trajectories, publish versions")
    add_config_flag(train, TrainerSettings, "AGENTFLOW_TRAINER_*", "docs/examples/train.toml",
                    extra={"bootstrap": addresses})
    argument_group(train, "connection").add_argument(
        "--bootstrap", type=addresses, help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS; "
                                            "also a key of the --config file)")
    _add_settings_flags(train, TrainerSettings)
    for old, new in OLD_GRPO_NAMES.items():  # the names before --grpo-*: read (with a warning) until the next release
        train.add_argument(flag_name(old), dest=old, type=flag_check(GRPOConfig, new), help=argparse.SUPPRESS)
    train.set_defaults(handler=_train)

    drive = commands.add_parser("drive", help="send training queries G times each through the gateway")
    add_config_flag(drive, DriveSettings, "AGENTFLOW_DRIVE_*", "docs/examples/drive.toml")
    _add_settings_flags(drive, DriveSettings)
    drive.set_defaults(handler=_drive)

    mirror = commands.add_parser("fleet-mirror", help="keep local copies of a remote model store's base and newest "
                                                      "versions (the full-weight rollout fleet's sidecar)")
    mirror.add_argument("--store", required=True, help="the model store's URI (s3://bucket/planner/versions)")
    mirror.add_argument("--into", required=True, help="the local folder: <into>/<version> for each one kept")
    mirror.add_argument("--keep", type=integer(1, 64), default=2,
                        help="newest versions kept besides the base (default 2: the one loaded and the next)")
    mirror.add_argument("--poll-s", type=number(0, 3600, lo_open=True), default=10.0,
                        help="seconds between two reads of the store (default 10)")
    mirror.set_defaults(handler=_fleet_mirror)
