"""``bench/trainer.py`` runs in-process on a tiny setting and reports both trainers' update throughput."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trainer.py"
TINY = ["--batch", "4", "--group-size", "2", "--micro-batch", "2", "--prompt-len", "12", "--completion-len", "6",
        "--hidden", "32", "--layers", "1", "--updates", "1", "--repeats", "1", "--device", "cpu"]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_trainer", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_bench_reports_both_trainers(capsys):
    pytest.importorskip("trl")  # a test-only dependency
    result = load_bench().main(TINY)
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(result))
    for key in ("ours_tokens_per_s", "trl_tokens_per_s", "ratio", "settings", "torch_threads", "model",
                "peak_mem_mb", "mem_method", "flops_per_token"):
        assert key in last
    assert last["ours_tokens_per_s"] > 0 and last["trl_tokens_per_s"] > 0
    assert last["ratio"] == pytest.approx(last["ours_tokens_per_s"] / last["trl_tokens_per_s"])
    assert last["dtype"] == "float32" and last["lora"] is None and last["mem_method"].startswith("rss_")
    assert last["peak_mem_mb"]["ours"] > 0 and last["peak_mem_mb"]["trl"] > 0
    assert last["flops_per_token"] == 6 * last["model"]["params"]
    # the same first update from the same weights on the same batch: the two objectives agree
    assert last["first_loss"]["ours"] == pytest.approx(last["first_loss"]["trl"], abs=1e-6)


@pytest.mark.slow
def test_bench_qwen_shape_lora_only_ours(monkeypatch, capsys):
    """The Qwen-shape path (random init written into the store as version 0) with LoRA, bf16 and activation
    checkpointing, ours alone — on a shrunken "qwen05b" so that it takes seconds."""
    bench = load_bench()
    monkeypatch.setitem(bench.SHAPES, "qwen05b", {
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 4096, "tie_word_embeddings": False})
    result = bench.main([*TINY, "--qwen05b", "--dtype", "bfloat16", "--lora", "4", "--gradient-checkpointing",
                         "--only", "ours", "--peak-tflops", "1"])
    assert "trl_tokens_per_s" not in result and "ratio" not in result and set(result["peak_mem_mb"]) == {"ours"}
    assert result["model"]["kind"] == "qwen05b" and result["model"]["vocab"] == 4096
    assert result["lora"] == {"rank": 4, "alpha": 8, "targets": "all-linear"}
    params, trainable = result["model"]["params"], result["model"]["trainable_params"]
    assert 0 < trainable < params and result["flops_per_token"] == 4 * params + 2 * trainable
    assert result["ours_mfu"] == pytest.approx(result["flops_per_token"] * result["ours_tokens_per_s"] / 1e12)


@pytest.mark.slow
def test_a_fake_world_holds_one_ranks_share_of_the_state():
    """``--fake-world 4``: rank 0 of 4 FSDP2 ranks on one device holds about a quarter of the weights, gradients and
    AdamW state (its optimizer steps run although the fake collectives leave noise in the gathered weights)."""
    bench = load_bench()
    tiny = [*TINY, "--hidden", "96", "--layers", "2", "--only", "ours"]
    state = {n: bench.main([*tiny, "--fake-world", str(n)])["mem_detail"]["ours"]["state_mb"] for n in (1, 4)}
    assert 0.2 * state[1] < state[4] < 0.35 * state[1], state


def test_new_flags_parse():
    bench = load_bench()
    args = bench.parse_args(["--device", "cpu"])
    assert (args.shape, args.dtype, args.lora, args.gradient_checkpointing, args.only) == (
        "tiny", "float32", 0, False, None)
    assert bench.parse_args(["--device", "cuda"]).dtype == "bfloat16"  # the default follows the device
    args = bench.parse_args(["--device", "cpu", "--shape", "qwen7b", "--dtype", "bfloat16", "--lora", "64",
                             "--gradient-checkpointing", "--only", "ours"])
    assert (args.shape, args.dtype, args.lora, args.gradient_checkpointing, args.only) == (
        "qwen7b", "bfloat16", 64, True, "ours")
    assert bench.parse_args(["--qwen05b"]).shape == "qwen05b"  # the old flag is an alias
    assert bench.parse_args(["--shape", "qwen15b"]).shape == "qwen15b"
    for bad in (["--lora", "-1"], ["--dtype", "float16"], ["--shape", "qwen3b"], ["--only", "trl"],
                ["--batch", "30"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_lora_config_and_flops():
    bench = load_bench()
    lora = bench.lora_config(bench.parse_args(["--lora", "16"]))
    assert (lora.rank, lora.alpha, lora.target_modules()) == (16, 32.0, "all-linear")
    assert not bench.lora_config(bench.parse_args([])).enabled
    assert bench.flops_per_token(100, 100) == 600  # full-parameter: 6 N
    assert bench.flops_per_token(100, 0) == 400  # frozen: forward + input gradients


def test_qwen_shapes_have_the_published_sizes():
    """The random-init shapes match the published models' parameter counts (built on the meta device: no memory)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    bench = load_bench()
    expected = {"qwen05b": 0.494e9, "qwen15b": 1.544e9, "qwen7b": 7.616e9}
    for shape, count in expected.items():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**bench.SHAPES[shape]))
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(count, rel=2e-3), shape
