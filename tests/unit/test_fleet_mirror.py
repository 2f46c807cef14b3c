"""`agentflow fleet-mirror` (agentflow.trainer.mirror) on an fsspec store (memory://, a real in-process filesystem):
the base and the newest versions arrive whole, half-written ones never, and versions that fell out are deleted. On
a real S3-compatible server, as a process: tests/integration/test_model_store_s3.py."""

from __future__ import annotations

import json
import threading
import uuid

import fsspec
import pytest

from agentflow.errors import InvalidInput
from agentflow.trainer.checkpoint import METADATA, ModelStore
from agentflow.trainer.mirror import mirror_once, mirror_store, wanted_versions


def write_version(root: str, n: int, *, committed: bool = True) -> None:
    fs = fsspec.filesystem("memory")
    folder = f"{root.removeprefix('memory://')}/v{n:06d}"
    fs.pipe({f"{folder}/config.json": b"{}", f"{folder}/model.safetensors": f"weights {n}".encode()})
    if committed:
        fs.pipe(f"{folder}/{METADATA}", json.dumps({"version": n}).encode())


@pytest.fixture
def store():
    return f"memory://mirror-{uuid.uuid4().hex[:8]}/planner/versions"


def test_the_base_then_the_newest_versions_are_wanted():
    assert wanted_versions([], 2) == []
    assert wanted_versions([0], 2) == [0]
    assert wanted_versions([0, 1, 2, 3], 2) == [0, 3, 2]
    assert wanted_versions([5, 6], 1) == [6]  # a store pruned of its base: nothing older to start from


def test_the_mirror_copies_committed_versions_whole_and_deletes_those_that_fell_out(store, tmp_path):
    for n in (0, 1, 2):
        write_version(store, n)
    write_version(store, 3, committed=False)  # being uploaded: its metadata comes last
    into = tmp_path / "mirror"
    into.mkdir()
    assert mirror_once(ModelStore(store), into, keep=2) == ["v000000", "v000002", "v000001"]
    assert sorted(p.name for p in into.iterdir()) == ["v000000", "v000001", "v000002"]
    assert (into / "v000002" / "model.safetensors").read_bytes() == b"weights 2"
    assert mirror_once(ModelStore(store), into, keep=2) == []  # nothing new: nothing downloaded again
    write_version(store, 3)
    write_version(store, 4)
    assert mirror_once(ModelStore(store), into, keep=2) == ["v000004", "v000003"]
    assert sorted(p.name for p in into.iterdir()) == ["v000000", "v000003", "v000004"]
    assert not [p for p in into.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_store_that_cannot_be_read_is_tried_again_and_stop_ends_the_loop(store, tmp_path, monkeypatch):
    write_version(store, 0)
    calls, stop = [], threading.Event()
    real = ModelStore.versions

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            raise PermissionError("access denied")
        stop.set()
        return real(self)

    monkeypatch.setattr(ModelStore, "versions", flaky)
    mirror_store(ModelStore(store), tmp_path / "mirror", keep=1, stop=stop, poll_s=0.01)
    assert len(calls) == 2 and (tmp_path / "mirror" / "v000000" / "config.json").is_file()
    with pytest.raises(InvalidInput, match="keep"):
        mirror_store(ModelStore(store), tmp_path / "m", keep=0, stop=stop)
    with pytest.raises(InvalidInput, match="local folder"):
        ModelStore(tmp_path / "local").download(0, tmp_path / "x")
