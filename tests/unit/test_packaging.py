"""pyproject.toml lists every package by hand (services/ and trainer/ are mapped): keep the list complete."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAPPED = {"agentflow": "agentflow", "agentflow.services": "services", "agentflow.trainer": "trainer"}


def test_every_package_folder_is_listed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for package, folder in MAPPED.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((package, *rel)))
    assert found == listed, f"add to / remove from pyproject.toml: {sorted(found ^ listed)}"


def test_torch_is_pinned():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in deps
