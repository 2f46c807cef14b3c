"""The model store on a local folder and on an fsspec URI (memory://, a real in-process filesystem), and the shared
download-into-the-cache helper (agentflow.storage) the LLM server uses for checkpoint URIs."""

import json
import uuid

import fsspec
import pytest
import torch

from agentflow.errors import InvalidInput
from agentflow.services.serving import _local_path
from agentflow.storage import local_copy
from agentflow.trainer.checkpoint import METADATA, ModelStore


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(folder))
    return folder


@pytest.fixture
def root(cache):
    """A fresh memory:// store root (the memory filesystem is one per process)."""
    path = f"/store-{uuid.uuid4().hex[:8]}"
    yield f"memory://{path}"
    fsspec.filesystem("memory").rm(path, recursive=True)


def memory_files(path: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").find(path))


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_remote_versions_are_committed_by_their_metadata(tiny, root):
    model, tok = tiny
    store = ModelStore(root)
    assert store.latest() is None and store.versions() == []
    v0 = store.save(model, tok, parent=None, extra={"profile": "tiny-deterministic"})
    v1 = store.save(model, tok, parent=0, metrics={"reward": 0.5},
                    write_extra=lambda folder: (folder / "trainer_state.pt").write_bytes(b"state"))
    assert store.versions() == [0, 1] and (v0.version, v1.version) == (0, 1)
    assert v1.uri.startswith("memory://") and v1.uri.endswith("/v000001")
    remote = memory_files(root.removeprefix("memory://") + "/v000001")
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer_state.pt", METADATA} <= set(remote)
    assert v1.path.is_dir() and (v1.path / "trainer_state.pt").read_bytes() == b"state"  # the cache copy
    got = store.get(1)
    assert got.uri == v1.uri and got.metadata["metrics"] == {"reward": 0.5} and got.metadata["parent"] == 0
    assert store.get(0).metadata["profile"] == "tiny-deterministic"
    with pytest.raises(InvalidInput, match="next version is 2"):
        store.save(model, tok, parent=1, version=5)
    with pytest.raises(InvalidInput, match="no version 9"):
        store.get(9)


def test_a_partial_upload_is_ignored_then_overwritten(tiny, root):
    model, tok = tiny
    store = ModelStore(root)
    store.save(model, tok, parent=None)
    fs, base = fsspec.filesystem("memory"), root.removeprefix("memory://")
    # what a crash mid-upload leaves: the files, no metadata (it goes last)
    fs.copy(f"{base}/v000000", f"{base}/v000001", recursive=True)
    fs.rm(f"{base}/v000001/{METADATA}")
    fs.pipe(f"{base}/v000001/half-written.bin", b"junk")
    assert ModelStore(root).versions() == [0]
    with pytest.raises(InvalidInput, match="no version 1"):
        store.get(1)
    again = store.save(model, tok, parent=0)
    assert again.version == 1 and store.versions() == [0, 1]
    assert "half-written.bin" not in memory_files(f"{base}/v000001")
    assert json.loads(fs.cat_file(f"{base}/v000001/{METADATA}"))["parent"] == 0


def test_get_downloads_into_a_fresh_cache_and_loads(tiny, root, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny
    ModelStore(root).save(model, tok, parent=None)
    fresh = tmp_path / "fresh-cache"
    monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(fresh))
    checkpoint = ModelStore(root).get(0)
    assert not fresh.exists()  # the metadata alone is read remotely; the folder is fetched on first use
    path = checkpoint.path
    assert path.parent.parent == fresh and path.name == "v000000"
    assert [p.name for p in path.parent.iterdir()] == ["v000000"]  # no temporary folder left behind
    assert same_weights(AutoModelForCausalLM.from_pretrained(path), model)
    assert AutoTokenizer.from_pretrained(path).encode("hello") == tok.encode("hello")
    # the LLM server's loader takes the same URI and finds the same cached folder
    assert _local_path(checkpoint.uri) == path


def test_a_stale_cached_copy_is_downloaded_again(tiny, root):
    """A store wiped and written again reuses version numbers: a cached copy whose metadata differs is replaced."""
    model, tok = tiny
    store = ModelStore(root)
    cached = store.save(model, tok, parent=None, extra={"run": 2}).path
    (cached / METADATA).write_text(json.dumps({"run": 1}))  # as if this machine had cached the earlier run's v0
    (cached / "stale.bin").write_bytes(b"old")
    path = store.get(0).path
    assert path == cached and json.loads((path / METADATA).read_text())["run"] == 2
    assert not (path / "stale.bin").exists()


def test_prune_deletes_remote_folders_and_their_cache(tiny, root):
    model, tok = tiny
    store = ModelStore(root)
    for parent in (None, 0, 1, 2):
        store.save(model, tok, parent=parent)
    assert store.prune(keep_last=2) == [1] and store.versions() == [0, 2, 3]
    base = root.removeprefix("memory://")
    assert not fsspec.filesystem("memory").exists(f"{base}/v000001")
    assert not (store.cache / "v000001").exists() and (store.cache / "v000002").is_dir()


@pytest.mark.parametrize("where", ["local", "remote"])
def test_only_the_newest_versions_keep_their_resume_state(tiny, cache, tmp_path, request, where):
    """A restart reads the newest version's resume/ only: older ones drop it (the largest files of a version) and
    stay versions, in the store and in the cache."""
    model, tok = tiny
    root = request.getfixturevalue("root") if where == "remote" else ""
    store = ModelStore(root or tmp_path / "store")

    def resume(folder):
        (folder / "resume").mkdir()
        (folder / "resume" / "optim.distcp").write_bytes(b"x" * 1000)

    for parent in (None, 0, 1, 2, 3):
        store.save(model, tok, parent=parent, write_extra=resume)
    assert store.drop_folder("resume", keep_newest=2) == [0, 1, 2] and store.versions() == [0, 1, 2, 3, 4]
    for version in range(5):
        kept = version >= 3
        assert (store.cache / f"v00000{version}" / "resume").is_dir() == kept
        if where == "remote":
            remote = f"{root.removeprefix('memory://')}/v00000{version}"
            assert ("optim.distcp" in memory_files(remote)) == kept and METADATA in memory_files(remote)
    assert store.drop_folder("resume", keep_newest=2) == [] and store.drop_folder("resume", keep_newest=0) == []


def test_local_store_keeps_its_layout(tiny, tmp_path, cache):
    model, tok = tiny
    store = ModelStore(tmp_path / "store")
    v0 = store.save(model, tok, parent=None)
    (tmp_path / "store" / ".v000001-crashed").mkdir()  # a half-written folder is not a version
    (tmp_path / "store" / "v000001").mkdir()  # nor one without metadata
    assert store.versions() == [0]
    assert v0.path == tmp_path / "store" / "v000000" and v0.uri == str((tmp_path / "store" / "v000000").resolve())
    same = ModelStore(f"file://{tmp_path / 'store'}").get(0)
    assert same.path == v0.path and same.uri == v0.uri and same.metadata == v0.metadata
    assert local_copy(v0.uri) == v0.path and not cache.exists()  # local folders are never copied
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [".v000001-crashed", "v000000", "v000001"]


def test_clear_errors_for_unusable_uris(tmp_path):
    with pytest.raises(InvalidInput, match="Protocol not known: nosuch"):
        ModelStore("nosuch://bucket/models")
    with pytest.raises(InvalidInput, match="gcsfs"):  # a protocol fsspec knows whose package is not installed
        local_copy("gs://bucket/models/v000001")
    with pytest.raises(InvalidInput, match="does not exist or is empty"):
        _local_path(f"memory:///missing-{uuid.uuid4().hex[:8]}")
    (tmp_path / "weights").mkdir()
    with pytest.raises(InvalidInput, match="no config.json"):
        _local_path(str(tmp_path / "weights"))


def test_an_object_key_that_climbs_out_of_its_folder_is_refused(tmp_path):
    """Object stores allow ".." in a key; a download must not write outside the folder it fills."""
    root = f"/climb-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").pipe({f"{root}/v000001/config.json": b"{}",
                                      f"{root}/v000001/../../escape.txt": b"x"})
    from agentflow import storage

    fs, path = storage.filesystem(f"memory://{root}/v000001")
    with pytest.raises(InvalidInput, match="not inside"):
        storage.download(fs, path, tmp_path / "target")
    assert not (tmp_path.parent / "escape.txt").exists() and not (tmp_path / "target").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # the temporary folder went too
