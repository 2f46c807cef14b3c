#!/usr/bin/env bash
# The trainer bench's GPU runs (bench/trainer.py), prepared to run by hand on one CUDA GPU (an H200: ~7 minutes,
# under ~11); never in CI (it exits 2 without a GPU). One JSON line per run (the bench's JSON plus "run") is appended
# to $OUT/bench-gpu.jsonl when OUT is set, else ./bench-gpu.jsonl; each run's progress goes to bench-gpu-RUN.log
# beside it; a summary table is printed at the end.
#
#   1. qwen05b        bf16, full-parameter, ours vs TRL
#   2. qwen15b        bf16, full-parameter, ours vs TRL, MFU against --peak-tflops (H200 bf16 dense: 989)
#   3. qwen7b-lora64  bf16, LoRA rank 64, activation checkpointing, ours only: the peak memory (target: < 80 GB)
#   4. qwen7b-fsdp8   bf16, full-parameter, activation checkpointing, rank 0 of 8 FSDP2 ranks in a fake process group
#                     (--fake-world 8): one GPU of the 8-GPU job (values-gpu.yaml), its peak memory (target: < 80 GB)
#
# Every run: 32 single-turn trajectories (groups of 8), prompts of 256-512 tokens, completions of 128-256, micro-batches
# of 16 rows, 2 updates per batch, a warm-up and 3 timed repeats each. Settings: PYTHON (default .venv/bin/python, else
# python3), PEAK_TFLOPS (989), REPEATS (3), RUN_TIMEOUT (seconds per run, 300); extra arguments go to every run.
#
#   bash bench/gpu_trainer.sh
#   OUT=/tmp/out PEAK_TFLOPS=989 bash bench/gpu_trainer.sh --threads 8
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
DIR=${OUT:-.}
mkdir -p "$DIR"
RESULTS="$DIR/bench-gpu.jsonl"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "bench/gpu_trainer.sh: needs a CUDA GPU and a CUDA build of torch ($PY)" >&2
  exit 2
fi
"$PY" -c 'import torch; print("gpu:", torch.cuda.get_device_name(), "| torch", torch.__version__)' >&2

COMMON=(--device cuda --dtype bfloat16 --batch 32 --group-size 8 --prompt-len 512 --completion-len 256
        --micro-batch 16 --updates 2 --repeats "${REPEATS:-3}" --peak-tflops "${PEAK_TFLOPS:-989}")
START_LINE=1  # the summary covers this invocation's lines
if [[ -f "$RESULTS" ]]; then START_LINE=$(( $(wc -l < "$RESULTS") + 1 )); fi
FAILED=0

run() {
  local name=$1 line log="$DIR/bench-gpu-$1.log" started=$SECONDS
  shift
  echo "== $name: bench/trainer.py ${COMMON[*]} $*" >&2
  if line=$(timeout "${RUN_TIMEOUT:-300}" "$PY" bench/trainer.py "${COMMON[@]}" "$@" 2>"$log" | tail -n 1) \
      && [[ "$line" == "{"* ]]; then
    "$PY" -c 'import json, sys; d = json.loads(sys.argv[2]); print(json.dumps({"run": sys.argv[1], **d}))' \
      "$name" "$line" >> "$RESULTS"
    echo "   done in $(( SECONDS - started )) s" >&2
  else
    FAILED=1
    echo "   FAILED after $(( SECONDS - started )) s; the end of $log:" >&2
    tail -n 25 "$log" >&2 || true
    "$PY" -c 'import json, sys; print(json.dumps({"run": sys.argv[1], "error": "failed, see " + sys.argv[2]}))' \
      "$name" "$log" >> "$RESULTS"
  fi
}

run qwen05b --shape qwen05b "$@"
run qwen15b --shape qwen15b "$@"
run qwen7b-lora64 --shape qwen7b --lora 64 --gradient-checkpointing --only ours "$@"
run qwen7b-fsdp8 --shape qwen7b --gradient-checkpointing --fake-world 8 "$@"

"$PY" - "$RESULTS" "$START_LINE" <<'SUMMARY'
import json
import sys

path, first = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    runs = [json.loads(line) for line in f.readlines()[first - 1:] if line.strip()]


def cell(value, spec, width):
    return format("-" if value is None else format(value, spec), f">{width}")


def gb(mb):
    return None if mb is None else mb / 1024


print(f"{'run':15} {'ours tok/s':>11} {'TRL tok/s':>10} {'ratio':>6} {'ours MFU':>8} {'TRL MFU':>8} "
      f"{'ours GiB':>8} {'TRL GiB':>8} {'process peak GiB alloc/reserved':>32}")
for d in runs:
    if "error" in d:
        print(f"{d['run']:15} {d['error']}")
        continue
    peak, ours = d["peak_mem_mb"], d["mem_detail"]["ours"]
    device = f"{gb(ours['process_peak_mb']):.1f} / {cell(gb(ours.get('process_reserved_peak_mb')), '.1f', 0)}"
    print(f"{d['run']:15} {cell(d['ours_tokens_per_s'], ',.0f', 11)} {cell(d.get('trl_tokens_per_s'), ',.0f', 10)} "
          f"{cell(d.get('ratio'), '.2f', 6)} {cell(d.get('ours_mfu'), '.1%', 8)} {cell(d.get('trl_mfu'), '.1%', 8)} "
          f"{cell(gb(peak['ours']), '.1f', 8)} {cell(gb(peak.get('trl')), '.1f', 8)} {device:>32}")
    if d["settings"]["only"] == "ours" and d["lora"]:
        need = ours.get("process_reserved_peak_mb", ours["process_peak_mb"]) * 2 ** 20 / 1e9
        print(f"{'':15} {d['model']['kind']} LoRA rank {d['lora']['rank']}: {need:.1f} GB reserved at peak, fits in "
              f"80 GB: {'yes' if need < 80 else 'NO'}")
SUMMARY
echo "results: $RESULTS" >&2
exit "$FAILED"
