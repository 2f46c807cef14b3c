"""Where a LoRA adapter version's base comes from (agentflow.llm.models.adapter_base): its agentflow.json's base_uri,
a folder (absolute, or relative to the version) or an fsspec URI downloaded into the model cache."""

import json
import uuid

import pytest

from agentflow.errors import InvalidInput
from agentflow.llm.models import adapter_base


def version(folder, **metadata):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "agentflow.json").write_text(json.dumps({"export": "adapter", **metadata}))
    return folder


def base(folder):
    folder.mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("agentflow.json", '{"version": 0}')):
        (folder / name).write_text(text)
    return folder


def test_a_local_base_absolute_or_relative_to_the_version(tmp_path):
    full = base(tmp_path / "store" / "v000000")
    assert adapter_base(version(tmp_path / "store" / "v000001", base_uri=str(full))) == full
    assert adapter_base(version(tmp_path / "store" / "v000002", base_uri="../v000000")).resolve() == full


def test_a_remote_base_is_downloaded_into_the_cache(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(tmp_path / "cache"))
    root = f"memory://store-{uuid.uuid4().hex[:8]}/v000000"
    fs = fsspec.filesystem("memory")
    fs.pipe({f"{root}/config.json": b"{}", f"{root}/agentflow.json": b'{"version": 0}'})
    local = adapter_base(version(tmp_path / "v000001", base_uri=root))
    assert local.is_relative_to(tmp_path / "cache") and (local / "config.json").read_text() == "{}"


def test_an_adapter_without_a_usable_base_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="base_uri"):
        adapter_base(version(tmp_path / "v1"))
    with pytest.raises(InvalidInput, match="not a model folder"):
        adapter_base(version(tmp_path / "v2", base_uri=str(tmp_path)))
