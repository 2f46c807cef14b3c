"""Every `agentflow` command line in the README's and the docs' shell blocks parses with today's flags: a renamed or
removed flag, or a value its check refuses, fails here instead of in a newcomer's first hour. Parsing only: nothing
runs. Placeholders (HOST:PORT, FILE, URL, ...) and the files a line names are stood in for."""

import re
import shlex
from pathlib import Path

import pytest

from agentflow import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
PLACEHOLDERS = {"HOST:PORT": "127.0.0.1:9092", "HOST0:29400": "127.0.0.1:29400", "URL": "http://127.0.0.1:8000",
                "KEY": "a-key", "KEY1": "a-key", "RUN_ID-PID": "run-p0"}


def documented_commands() -> list[tuple[str, str]]:
    """(page, command line) for each `agentflow ...` line of a bash block, continuations joined, comments cut;
    lines that elide their flags (``...``) are left out."""
    found = []
    for page in PAGES:
        for block in SHELL_BLOCK.findall(page.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                match = re.search(r"(?:^|\s|/)agentflow (\w.*)$", line)
                if match and "..." not in line and not line.startswith(("torchrun", "helm", "kubectl", "skaffold")):
                    found.append((page.name, match.group(1)))
    return found


def stand_in(token: str, tmp: Path) -> str:
    """A value that passes the checks a real one would: placeholders, and files or folders that must exist (a model
    folder of another machine, /models/...)."""
    if token in PLACEHOLDERS:
        return PLACEHOLDERS[token]
    if token in ("FOLDER", "DIR", "A", "B") or token.startswith("/models/") or token.startswith("eval_runs/") and not token.endswith(".json"):
        return str(tmp)
    if token.endswith((".json", ".jsonl")) and "://" not in token:
        path = tmp / Path(token).name
        path.write_text('{"title": "t", "text": "x"}\n' if token.endswith(".jsonl") else "[]")
        return str(path)
    return token


@pytest.fixture(scope="module")
def parser():
    return cli._parser()


@pytest.mark.parametrize("page,command", documented_commands())
def test_a_documented_command_parses(parser, page, command, tmp_path):
    argv = [stand_in(token, tmp_path) for token in shlex.split(command.replace("[", "").replace("]", ""))]
    assert callable(parser.parse_args(argv).handler)


def test_the_docs_show_commands():
    pages = {page for page, _ in documented_commands()}
    assert len(documented_commands()) >= 20 and "README.md" in pages
