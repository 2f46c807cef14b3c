"""The model store on a real S3-compatible server (moto's, on 127.0.0.1) through s3fs, configured the way a
deployment is: AWS_* variables, AWS_ENDPOINT_URL for a server that is not AWS. The trainer writes versions and
resumes on a machine with an empty cache; the LLM server loads an s3:// checkpoint URI."""

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
import s3fs
import torch
from moto.server import ThreadedMotoServer

from agentflow.children import spawn_tied
from agentflow.services.serving import _local_path
from agentflow.trainer.checkpoint import METADATA, ModelStore

BUCKET = "agentflow-test"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_env():
    """moto's S3 server and the environment that points boto (so s3fs) at it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()  # an instance made earlier would keep its endpoint
        s3fs.S3FileSystem().mkdir(BUCKET)
        try:
            yield env
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            server.stop()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Point the model cache at a fresh folder; call again for another (a machine that has not seen the store)."""
    def fresh(name: str):
        folder = tmp_path / name
        monkeypatch.setenv("AGENTFLOW_MODEL_CACHE", str(folder))
        return folder

    return fresh


def test_versions_round_trip_through_s3(s3_env, tiny_model_dir, cache, request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = f"s3://{BUCKET}/{request.node.name}"
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    cache("writer")
    store = ModelStore(root)
    store.save(model, tok, parent=None)
    saved = store.save(model, tok, parent=0, metrics={"reward": 0.25})
    assert store.versions() == [0, 1] and saved.uri == f"{root}/v000001"
    objects = s3fs.S3FileSystem().ls(saved.uri, detail=False)
    assert {f"{saved.uri[5:]}/{name}" for name in ("config.json", "model.safetensors", METADATA)} <= set(objects)

    reader_cache = cache("reader")
    checkpoint = ModelStore(root).get(1)
    assert checkpoint.metadata["metrics"] == {"reward": 0.25}
    assert checkpoint.path == reader_cache / checkpoint.path.parent.name / "v000001"
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint.path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))

    cache("server")  # the LLM server's loader, on a machine of its own
    served = _local_path(saved.uri)
    assert (served / "config.json").is_file() and served.name == "v000001"

    store.save(model, tok, parent=1)
    assert store.prune(keep_last=1) == [1] and ModelStore(root).versions() == [0, 2]
    assert not s3fs.S3FileSystem().exists(saved.uri)


def test_trainer_resumes_from_s3_on_an_empty_cache(s3_env, tiny_model_dir, cache, request):
    from agentflow.trainer.loop import RESUME, Trainer

    root = f"s3://{BUCKET}/{request.node.name}"
    cache("first-pod")
    trainer = Trainer(tiny_model_dir, ModelStore(root))  # an empty store: the base model becomes v0
    trainer.version += 1
    trainer._checkpoint({"reward": 1.0}, {"consumer_offsets": {"0": 7}})  # what Trainer.step writes
    cache("second-pod")
    resumed = Trainer(tiny_model_dir, ModelStore(root))
    assert resumed.version == 1 and resumed.reference is not None  # the reference (v0) downloaded too
    latest = resumed.store.latest()
    assert latest.metadata["consumer_offsets"] == {"0": 7} and (latest.path / RESUME / ".metadata").is_file()


def test_serve_llm_loads_an_s3_checkpoint(s3_env, tiny_model_dir, cache, tmp_path, request):
    """`agentflow serve-llm --model s3://...` in its own process: the endpoint comes from the environment."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = f"s3://{BUCKET}/{request.node.name}"
    cache("trainer")
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    uri = ModelStore(root).save(model, tok, parent=None).uri
    env = {**os.environ, "AGENTFLOW_MODEL_CACHE": str(tmp_path / "llm-server"), "OMP_NUM_THREADS": "1"}
    server = spawn_tied([sys.executable, "-m", "agentflow.cli", "serve-llm", "--model", uri],
                        env=env, stdout=subprocess.PIPE, text=True)
    try:
        announced = json.loads(server.stdout.readline())
        assert announced["version"] == "v000000"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
        response = httpx.post(announced["url"] + "/chat/completions", json=body, timeout=30)
        assert response.status_code == 200 and response.headers["x-model-version"] == "v000000"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert (tmp_path / "llm-server").is_dir()


def test_the_fleet_mirror_follows_the_store_as_a_process(s3_env, tiny_model_dir, cache, tmp_path, request):
    """`agentflow fleet-mirror` (the full-weight fleet's sidecar with an object store): the base and each new
    version arrive whole in <into>/<version>, byte for byte; SIGTERM ends it."""
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = f"s3://{BUCKET}/{request.node.name}"
    cache("trainer")
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    store = ModelStore(root)
    store.save(model, tok, parent=None)
    into = tmp_path / "mirror"
    mirror = spawn_tied([sys.executable, "-m", "agentflow.cli", "fleet-mirror", "--store", root, "--into", str(into),
                         "--keep", "1", "--poll-s", "0.2"], env={**os.environ, "OMP_NUM_THREADS": "1"})

    def arrived(name: str, budget_s: float = 120.0) -> bool:
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline and mirror.poll() is None:
            if (into / name / METADATA).is_file():
                return True
            time.sleep(0.1)
        return False

    try:
        assert arrived("v000000")
        store.save(model, tok, parent=0)
        store.save(model, tok, parent=1)
        assert arrived("v000002")
        assert (into / "v000002" / "model.safetensors").read_bytes() == \
            (store.get(2).path / "model.safetensors").read_bytes()
        deadline = time.monotonic() + 60
        while (into / "v000001").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(p.name for p in into.iterdir()) == ["v000000", "v000002"]  # v1 fell out of --keep 1
    finally:
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(30) == 0
