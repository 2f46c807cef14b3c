"""`--config FILE.toml` for `agentflow train`, `drive` and `rollout` (agentflow/config.py, ``read_config``): the
precedence defaults < environment < file < flags, one line per bad file naming the file and the key, the examples in
docs/examples, and the grouped ``--help`` that still lists every flag."""

import argparse
from pathlib import Path

import pytest

from agentflow import cli
from agentflow.config import EngineSettings, _paths, flag_name, from_env, read_config
from agentflow.errors import InvalidInput
from agentflow.rollout import cli as rollout_cli
from agentflow.rollout.settings import RolloutSettings
from agentflow.trainer import cli as trainer_cli
from agentflow.trainer.drive import DriveSettings
from agentflow.trainer.service import OLD_GRPO_NAMES, TrainerSettings, trainer_settings

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SETTINGS = {"train": TrainerSettings, "drive": DriveSettings, "rollout": RolloutSettings}


def toml(tmp_path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def parse(*argv):
    return cli._parser().parse_args(list(argv))


def subparser(command: str):
    """The parser of ``agentflow COMMAND``."""
    commands = next(a for a in cli._parser()._actions if a.dest == "command")
    return commands.choices[command]


# --- precedence -----------------------------------------------------------------------------------------------------

def test_train_default_then_environment_then_file_then_flag(tmp_path):
    path = toml(tmp_path, "keep_last = 3\n[grpo]\nlr = 1e-4\n")
    env = {"AGENTFLOW_TRAINER_KEEP_LAST": "2", "AGENTFLOW_TRAINER_GRPO_LR": "1e-5"}

    def read(*argv, environ):
        args = parse("train", *argv)
        s = trainer_settings(environ=environ, flags=vars(args), config=args.config)
        return s.keep_last, s.grpo.lr

    assert read(environ={}) == (10, 1e-6)  # the defaults
    assert read(environ=env) == (2, 1e-5)  # the environment
    assert read("--config", path, environ=env) == (3, 1e-4)  # the file over the environment
    assert read("--config", path, "--keep-last", "4", "--grpo-lr", "1e-3", environ=env) == (4, 1e-3)  # a flag wins


def test_drive_and_rollout_take_the_file_between_environment_and_flags(tmp_path):
    path = toml(tmp_path, "concurrency = 4\nmax_steps = 5\n")
    args = parse("drive", "--config", path, "--max-steps", "6")
    s = from_env(DriveSettings, "DRIVE_", environ={"AGENTFLOW_DRIVE_CONCURRENCY": "2", "AGENTFLOW_DRIVE_RATE": "1"},
                 flags=vars(args), config=args.config)
    assert (s.concurrency, s.max_steps, s.rate) == (4, 6, 1.0)

    path = toml(tmp_path, 'min_samples = 50\nllm_url = "http://llm:8000"\ntick_s = 2\n', "r.toml")
    args = parse("rollout", "--config", path, "--min-samples", "30")
    s = rollout_cli.settings_from(args, environ={"AGENTFLOW_ROLLOUT_TICK_S": "9", "AGENTFLOW_ROLLOUT_ALPHA": "0.01"})
    assert (s.min_samples, s.llm_url, s.tick_s, s.alpha) == (30, "http://llm:8000", 2.0, 0.01)


def test_bootstrap_is_a_key_too_and_the_flag_wins(tmp_path):
    path = toml(tmp_path, 'bootstrap = "broker:9092"\n')
    assert trainer_cli._bus(parse("train", "--config", path)).bootstrap_servers == "broker:9092"
    assert trainer_cli._bus(parse("train", "--config", path, "--bootstrap", "b2:9092")).bootstrap_servers == "b2:9092"
    assert parse("rollout", "--config", path).config.values["bootstrap"] == "broker:9092"


def test_toml_types_that_fit(tmp_path):
    # an integer for a float, an array for a comma-separated setting or a tuple, "none" for an optional
    path = toml(tmp_path, 'reward_sources = ["rule", "vote"]\n[grpo]\nlr = 1\nmax_staleness = "none"\n')
    s = trainer_settings(environ={}, config=read_config(TrainerSettings, path))
    assert (s.grpo.lr, s.grpo.max_staleness, s.reward_sources) == (1.0, None, "rule,vote")
    path = toml(tmp_path, 'routing_endpoints = ["http://a:1/*", "http://b:2/*"]\n', "e.toml")
    s = from_env(EngineSettings, environ={}, config=read_config(EngineSettings, path))
    assert s.routing_endpoints == ("http://a:1/*", "http://b:2/*")


def test_a_rule_across_fields_names_the_file(tmp_path):
    path = toml(tmp_path, "[grpo]\ngroup_size = 5\n")
    with pytest.raises(InvalidInput, match=rf"^{path}: grpo.batch_trajectories: batch must hold whole groups"):
        trainer_settings(environ={}, config=read_config(TrainerSettings, path))
    with pytest.raises(InvalidInput) as e:  # a flag that gave it is named as the flag, and the file is not blamed
        trainer_settings(environ={}, flags={"grpo.group_size": 5}, config=read_config(TrainerSettings, path))
    assert str(e.value).startswith("grpo.batch_trajectories") and "--grpo-group-size" in str(e.value)


# --- one line per bad file ------------------------------------------------------------------------------------------

BAD = [  # (command, file text, what the line says besides the file)
    ("train", "[grpo]\nlrr = 1e-5\n", "[grpo] lrr: unknown key (did you mean [grpo] lr?)"),
    ("train", "grpo_lr = 1e-5\n", "grpo_lr: unknown key (did you mean [grpo] lr?)"),
    ("train", "model-store = 'x'\n", "model-store: unknown key (did you mean model_store?)"),
    ("train", "[grpo]\ngroup_size = '8'\n", "[grpo] group_size: must be an integer, not a string ('8')"),
    ("train", "gradient_checkpointing = 1\n", "gradient_checkpointing: must be true or false, not an integer (1)"),
    ("train", "grpo = 3\n", "grpo: must be a table ([grpo]), not an integer (3)"),
    ("train", "[grpo]\nlr = -1\n", "[grpo] lr: must be a finite number > 0 (got -1)"),
    ("train", "[lora]\ndropout = 1.5\n", "[lora] dropout: must be a finite number in [0, 1) (got 1.5)"),
    ("train", "metrics_port = 70000\n", "metrics_port: must be an integer in [-1, 65535]"),
    ("train", "bootstrap = 'nohost'\n", "bootstrap: must be comma-separated HOST:PORT"),
    ("train", "objective = 'dpo'\n", "objective: unknown: dpo"),
    ("train", "model_store = \n", "not TOML: Invalid value (at line 1, column 15)"),
    ("drive", "concurrency = 0\n", "concurrency: must be an integer >= 1 (got 0)"),
    ("drive", "gatway = '127.0.0.1:50051'\n", "gatway: unknown key (did you mean gateway?)"),
    ("rollout", "alpha = 0.7\n", "alpha: must be a finite number in (0, 0.5) (got 0.7)"),
    ("rollout", "steps = [50, 10, 100]\n", "steps: must rise strictly from at least 1 and end at 100"),
    ("rollout", "backend = 'argo'\n", "backend: unknown: argo"),
    ("rollout", "tripwire_refusal_rate = 0\n", "tripwire_refusal_rate: must be a finite number in (0, 1]"),
    ("rollout", "min_sample = 10\n", "min_sample: unknown key (did you mean min_samples?)"),
]


def refusal(capsys, *argv) -> str:
    """The one stderr line of ``agentflow ARGV``, refused by its parser with status 2."""
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("command, text, says", BAD)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(command, text, says, tmp_path, capsys):
    path = toml(tmp_path, text)
    line = refusal(capsys, command, "--config", path)
    assert line.startswith(f"agentflow {command}: error: argument --config: {path}: ")
    assert says in line, line


def test_a_file_that_cannot_be_read_is_one_line(tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "missing.toml")
    assert refusal(capsys, "train", "--config", missing).endswith(f"{missing}: no such file")
    assert refusal(capsys, "drive", "--config", str(tmp_path)).endswith(f"{tmp_path}: is a folder, not a file")
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe = 1\n")
    assert refusal(capsys, "rollout", "--config", str(binary)).endswith("not TOML: not UTF-8 text")

    def denied(path, mode):  # as a file without read permission does (chmod would not stop root)
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr("agentflow.config.open", denied, raising=False)
    line = refusal(capsys, "train", "--config", "locked.toml")
    assert line.endswith("locked.toml: cannot read it: Permission denied")


def test_a_file_value_and_a_flag_value_are_refused_alike(tmp_path, capsys):
    as_flag = refusal(capsys, "train", "--grpo-lr", "-1")
    as_key = refusal(capsys, "train", "--config", toml(tmp_path, "[grpo]\nlr = -1\n"))
    assert as_flag.rpartition(": ")[2] == as_key.rpartition(": ")[2] == "must be a finite number > 0 (got -1)"


def test_a_rule_across_fields_in_the_file_stops_train_before_it_connects(tmp_path, capsys):
    path = toml(tmp_path, "[grpo]\ngroup_size = 5\n")
    assert cli.main(["train", "--config", path, "--bootstrap", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.startswith(f"agentflow: error: {path}: grpo.batch_trajectories: batch must hold")


# --- the examples ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", SETTINGS)
def test_each_example_parses_and_validates(command):
    example = EXAMPLES / f"{command}.toml"
    args = parse(command, "--config", str(example))
    assert args.config.values  # every key checked, none left out
    if command == "train":
        trainer_settings(environ={}, flags=vars(args), config=args.config)
    elif command == "drive":
        from_env(DriveSettings, "DRIVE_", environ={}, flags=vars(args), config=args.config)
    else:
        rollout_cli.settings_from(args, environ={})


# --- --help ---------------------------------------------------------------------------------------------------------

COMMON = {"-h", "--help", "-v", "--verbose", "--config"}
EXPECTED = {
    "train": {flag_name(p) for p in _paths(TrainerSettings)} | {flag_name(o) for o in OLD_GRPO_NAMES} | {"--bootstrap"},
    "drive": {flag_name(p) for p in _paths(DriveSettings)},
    "rollout": {"--" + flag.replace("_", "-") for flag in rollout_cli._FLAGS} | {"--bootstrap"},
}
TITLES = {
    "train": ["config file", "connection", "model store and versions", "Flow-GRPO (--grpo-*)", "groups and rewards",
              "compute", "LoRA (--lora-*)", "objective", "metrics and tracking", "run"],
    "drive": ["config file", "gateway", "queries", "rollouts", "pace", "progress and metrics"],
    "rollout": ["config file", "connection", "backend", "routing", "rollout fleet", "canary steps", "sequential test",
                "tripwires", "controller and metrics"],
}


@pytest.mark.parametrize("command", SETTINGS)
def test_help_is_grouped_and_lists_every_flag(command, capsys):
    parser = subparser(command)
    options = {s for action in parser._actions for s in action.option_strings}
    assert options == EXPECTED[command] | COMMON
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    shown = capsys.readouterr().out
    titles = [line[:-1] for line in shown.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles[titles.index("config file"):] == TITLES[command]
    assert "precedence: defaults <" in shown and "< the --config file < flags" in " ".join(shown.split())
    hidden = {s for action in parser._actions if action.help == argparse.SUPPRESS for s in action.option_strings}
    assert hidden == ({flag_name(o) for o in OLD_GRPO_NAMES} if command == "train" else set()) | {"-v", "--verbose"}
    assert [option for option in options - hidden if option not in shown] == []
    assert [option for option in hidden if f" {option} " in shown or f"[{option}" in shown] == []


def test_settings_flags_keep_their_dest_and_checker_and_sit_in_their_section():
    parser = subparser("train")
    by_dest = {a.dest: a for a in parser._actions}
    assert by_dest["grpo.lr"].option_strings == ["--grpo-lr"] and by_dest["grpo.lr"].type("0.5") == 0.5
    assert by_dest["lora.rank"].option_strings == ["--lora-rank"]
    section = {a.dest: g.title for g in parser._action_groups for a in g._group_actions}
    assert section["grpo.lr"] == "Flow-GRPO (--grpo-*)" and section["lora.rank"] == "LoRA (--lora-*)"
    assert section["model_store"] == "model store and versions" and section["bootstrap"] == "connection"
    rollout = {a.dest: g.title for g in subparser("rollout")._action_groups for a in g._group_actions}
    assert rollout["isvc"] == "backend" and rollout["alpha"] == "sequential test"


def test_a_flag_given_as_none_is_none_not_absent():
    """`--grpo-max-staleness none` turns the staleness bound off; before, argparse's None read as "not given"."""
    from agentflow import cli
    from agentflow.trainer.service import trainer_settings

    parser = cli._parser()
    default = trainer_settings(flags=vars(parser.parse_args(["train"]))).grpo.max_staleness
    given = trainer_settings(flags=vars(parser.parse_args(["train", "--grpo-max-staleness", "none"])))
    assert default is not None and given.grpo.max_staleness is None
    assert trainer_settings(flags=vars(parser.parse_args(["train", "--grpo-max-staleness", "2"]))).grpo.max_staleness == 2
