"""The trainer's disk (docs/deploy.md, "The trainer's disk"): the 7B values files size the model cache from
trainer.model.parametersB, and a values file whose cache or store claim cannot hold what the trainer keeps fails to
render with a message that says so. The expected sizes are computed here, independently of the chart's helper."""

from __future__ import annotations

import math

import pytest

from .conftest import Render, parse, template
from .test_chart_objects import FULLNAME
from .test_chart_trainer import FULL8, GPU, LORA, NAME, write_values

GIB = 2**30


def kept_gib(params_b: float, *, lora_share: float = 0.0, keep_last: int = 10, keep_resume: int = 2) -> dict:
    """What the trainer keeps, in GiB: v0 in bf16; keep_last versions plus the eight pruning spares (reference,
    stable, canary, four withdrawn, the one being written); keep_resume + 1 resume states of float32 weights and two
    AdamW moments (12 bytes a trained parameter)."""
    params = params_b * 1e9
    trained = params * lora_share if lora_share else params
    full = 2 * params / GIB
    version = 2 * trained / GIB if lora_share else full
    store = full + (keep_last + 8) * version + (keep_resume + 1) * 12 * trained / GIB
    return {"full": full, "store": store}


def volume(render: Render, name: str) -> dict:
    spec = render.get("Deployment", NAME)["spec"]["template"]["spec"]
    return next(v for v in spec["volumes"] if v["name"] == name)


def render(helm, files, tmp_path, values: dict | None = None, check: bool = True):
    extra = [write_values(tmp_path, values)] if values else []
    result = template(helm, [*files, *extra], check=check)
    return result if not check else Render(result.stdout, parse(result.stdout))


def test_full_7b_on_an_object_store_caches_the_base_and_a_copy_of_the_store(helm, tmp_path):
    """values-gpu-8-full-7b.yaml (object store from values-gpu.yaml): 7.62 B parameters, bf16 versions of 14.2 GiB,
    resume states of 85 GiB: the cache is the base plus the store, 10 % over, in whole GiB."""
    need = kept_gib(7.62)
    assert round(need["store"]) == 525  # 14.2 + 18 x 14.2 + 3 x 85.2
    cache = volume(render(helm, [GPU, FULL8], tmp_path), "model-cache")
    assert cache == {"name": "model-cache", "emptyDir": {"sizeLimit": f"{math.ceil(1.1 * (need['full'] + need['store']))}Gi"}}
    main = render(helm, [GPU, FULL8], tmp_path).get("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "AGENTFLOW_MODEL_CACHE", "value": "/cache/models"} in main["env"]
    assert {"name": "model-cache", "mountPath": "/cache"} in main["volumeMounts"]


def test_lora_7b_store_claim_holds_its_versions(helm, tmp_path):
    """values-gpu-lora-7b.yaml: adapters only (2.1 % of the parameters) on a 200Gi claim; the cache holds the base."""
    need = kept_gib(7.62, lora_share=0.021)
    assert 20 < need["store"] < 200
    docs = render(helm, [GPU, LORA], tmp_path)
    assert volume(docs, "model-cache")["emptyDir"] == {"sizeLimit": f"{math.ceil(1.1 * need['full'])}Gi"}
    claim = docs.get("PersistentVolumeClaim", f"{FULLNAME}-checkpoints")
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"


@pytest.mark.parametrize("files, values, words", [
    # a claim just under what the LoRA store keeps (24.9 GiB)
    ([GPU, LORA], {"trainer": {"modelStore": {"pvc": {"size": "24Gi"}}}},
     ["trainer.modelStore.pvc.size 24Gi", "about 25 GiB", "7.62B parameters", "keep_last"]),
    # a given cache under the full 7B's copy of the store
    ([GPU, FULL8], {"trainer": {"cache": {"size": "500Gi"}}},
     ["trainer.cache.size 500Gi", "about 540 GiB"]),
    # keeping every version fits no disk
    ([GPU, FULL8], {"trainer": {"settings": {"keep_last": 0}}}, ["trainer.settings.keep_last 0"]),
    ([GPU, FULL8], {"trainer": {"settings": {"keep_resume": 0}}}, ["trainer.settings.keep_resume 0"]),
], ids=["claim-too-small", "cache-too-small", "keep-every-version", "keep-every-resume"])
def test_a_values_file_that_cannot_fit_its_model_fails_to_render(helm, tmp_path, files, values, words):
    result = render(helm, files, tmp_path, values, check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr


def test_fewer_kept_versions_shrink_the_cache_and_a_given_size_that_fits_is_kept(helm, tmp_path):
    need = kept_gib(7.62, keep_last=2, keep_resume=1)
    smaller = render(helm, [GPU, FULL8], tmp_path, {"trainer": {"settings": {"keep_last": 2, "keep_resume": 1}}})
    assert volume(smaller, "model-cache")["emptyDir"]["sizeLimit"] == \
        f"{math.ceil(1.1 * (need['full'] + need['store']))}Gi"
    given = render(helm, [GPU, FULL8], tmp_path, {"trainer": {"cache": {"size": "1Ti"}}})
    assert volume(given, "model-cache")["emptyDir"]["sizeLimit"] == "1Ti"


def test_a_storage_class_makes_the_cache_a_claim_per_pod(helm, tmp_path):
    docs = render(helm, [GPU, FULL8], tmp_path, {"trainer": {"cache": {"storageClassName": "local-nvme"}}})
    claim = volume(docs, "model-cache")["ephemeral"]["volumeClaimTemplate"]["spec"]
    need = kept_gib(7.62)
    assert claim["storageClassName"] == "local-nvme"
    assert claim["resources"]["requests"]["storage"] == f"{math.ceil(1.1 * (need['full'] + need['store']))}Gi"


def test_without_a_model_size_the_cache_is_20gi(helm, tmp_path):
    assert volume(render(helm, [GPU], tmp_path), "model-cache")["emptyDir"] == {"sizeLimit": "20Gi"}
