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


# --- the allow-list (a server's model roots) holds for the base too ---------------------------------------------------

def test_a_base_outside_the_allowed_roots_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(tmp_path / "cache"))
    store, outside = tmp_path / "store", base(tmp_path / "elsewhere")
    inside = base(store / "v000000")
    (store / "link").symlink_to(outside)
    remote = f"memory://evil-{uuid.uuid4().hex[:8]}/v000000"
    fsspec.filesystem("memory").pipe({f"{remote}/config.json": b"{}", f"{remote}/agentflow.json": b"{}"})
    allowed = [str(store)]
    assert adapter_base(version(store / "v000001", base_uri="../v000000"), allowed_roots=allowed).resolve() == \
        inside.resolve()
    for n, uri in enumerate([str(outside), f"file://{outside}", "../../elsewhere", "../link", remote], start=2):
        with pytest.raises(InvalidInput, match="outside the allowed roots"):
            adapter_base(version(store / f"v00000{n}", base_uri=uri), allowed_roots=allowed)
    assert not (tmp_path / "cache").exists()  # the remote base was never downloaded


def test_serve_llm_refuses_an_adapter_whose_base_is_outside_its_roots(tiny_model_dir, tmp_path, monkeypatch):
    """serve-llm's loader behind a real admin API on 127.0.0.1: the adapter folder is inside --model-store, the
    base its agentflow.json names (a remote folder) is not: 400 with the reason, nothing downloaded or loaded."""
    import shutil

    import fsspec
    import httpx

    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.llm.server import make_server, serve_in_background
    from agentflow.llm.versions import Versions
    from agentflow.services.serving import version_loader

    monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(tmp_path / "cache"))
    remote = f"memory://evil-{uuid.uuid4().hex[:8]}/v000000"
    fsspec.filesystem("memory").pipe({f"{remote}/config.json": b"{}", f"{remote}/agentflow.json": b"{}"})
    store = tmp_path / "store"
    adapter = version(store / "v000001", base_uri=remote)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, adapter / name)
    versions = Versions(version_loader([str(tiny_model_dir), str(store)]))
    versions.add("v000000", str(tiny_model_dir), engine=ScriptedEngine(["hi"]))
    server = make_server(versions, "planner", admin_token="secret")
    serve_in_background(server)
    try:
        response = httpx.post(f"http://127.0.0.1:{server.server_address[1]}/admin/versions", timeout=30,
                              json={"name": "v000001", "uri": str(adapter)}, headers={"Authorization": "Bearer secret"})
    finally:
        server.shutdown()
    assert response.status_code == 400 and "outside the allowed roots" in response.json()["error"]["message"]
    assert versions.names() == ["v000000"] and not (tmp_path / "cache").exists()
