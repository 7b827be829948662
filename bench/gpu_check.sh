#!/usr/bin/env bash
# One prepared check of pipe train on a single GPU: NCCL with world size 1, bf16 and fp16,
# gradient checkpointing off and on; prints samples/s and peak GPU memory of each run.
#
#   bench/gpu_check.sh                 # ~5 min on one modern GPU
#   IMAGES=512 EPOCHS=1 bench/gpu_check.sh   # a quicker look
#
# It builds its own data (synthetic class-coloured JPEGs -> pipe clean -> pipe shard), then runs
# `pipe train --nproc-per-node 1 --backend nccl` four times. Every run goes through the real
# launcher: the rank joins an NCCL process group of size 1 (initialised eagerly, torn down
# with a barrier), so a broken NCCL/driver pairing fails here and not on the cluster.
# Outputs stay in $OUT (default: a new temporary folder) for a look at metrics.jsonl and tb/.
# Then the pretrained-model path: torchvision ResNet-50 and ViT-B/16 at 224 px with bf16 (built
# without weights: random initialisation, the speed is the same), ViT-B/16 once more under
# --strategy fsdp; skipped when torchvision does not load.
#
# Written to be correct by reading; it has not run on a GPU yet (none was available when it was
# written): the first run's output belongs in the closing note of the training work.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
IMAGES=${IMAGES:-2048}
SIZE=${SIZE:-256}
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-128}
WORKERS=${WORKERS:-6}
OUT=${OUT:-$(mktemp -d -t pipe-gpu-check.XXXXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== the machine =="
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
fi
"$PY" - <<'EOF'
import os, sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no GPU (torch %s, built for CUDA %s); install a CUDA build of torch"
             % (torch.__version__, torch.version.cuda))
import torch.distributed as dist
nccl = torch.cuda.nccl.version()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}, {torch.cuda.get_device_name(0)}, "
      f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}")
# NCCL, world size 1: one all-reduce on the GPU before anything else
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("GPU_CHECK_PORT", "29561"))
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.full((4,), 2.0, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
assert t.tolist() == [2.0] * 4, t
dist.barrier()
dist.destroy_process_group()
print("NCCL world size 1: init, all_reduce, barrier, destroy: ok")
EOF

echo "== data: $IMAGES images of ${SIZE}px -> pipe clean -> pipe shard (in $OUT) =="
"$PY" -c "
from pathlib import Path
from bench.train import make_raw
make_raw(Path('$OUT/raw'), $IMAGES, $SIZE)
"
"$PY" -m pipeline clean "$OUT/raw" -o "$OUT/clean" --size "$SIZE" >/dev/null
"$PY" -m pipeline shard "$OUT/clean" -o "$OUT/shards" --val-fraction 0.1 >/dev/null

# --width 64 --resolution 224: a model big enough that the GPU, not Python, sets the pace
for precision in bf16 fp16; do
  for ckpt in off on; do
    run="$OUT/run-$precision-ckpt-$ckpt"
    flags=()
    [ "$ckpt" = on ] && flags+=(--grad-checkpoint)
    echo "== pipe train: NCCL x 1, --precision $precision, gradient checkpointing $ckpt =="
    "$PY" -m pipeline train "$OUT/shards" -o "$run" --nproc-per-node 1 --backend nccl \
      --precision "$precision" ${flags[@]+"${flags[@]}"} --epochs "$EPOCHS" --batch-size "$BATCH" \
      --workers "$WORKERS" --model image --width 64 --resolution 224 --log-every 5 \
      --checkpoint-every 0 2>"$run.log" >/dev/null || { tail -5 "$run.log"; exit 1; }
    grep -q "precision $precision" "$run.log" && grep -q "backend nccl" "$run.log" \
      || { echo "gpu_check: the run did not use $precision over nccl:"; head -20 "$run.log"; exit 1; }
  done
done

# torchvision models, bf16, the same shards (stored at $SIZE px, decoded at 224)
TV_BATCH=${TV_BATCH:-64}
tv_runs=()
if "$PY" -c "import torchvision" 2>/dev/null; then
  for spec in "torchvision:resnet50 ddp" "torchvision:vit_b_16 ddp" "torchvision:vit_b_16 fsdp"; do
    read -r model strategy <<<"$spec"
    name="run-${model#torchvision:}-$strategy"
    flags=()
    [ "$strategy" = fsdp ] && flags+=(--strategy fsdp)  # the fsdp branch's flag
    echo "== pipe train: $model, bf16, $strategy =="
    if "$PY" -m pipeline train "$OUT/shards" -o "$OUT/$name" --nproc-per-node 1 --backend nccl --precision bf16 \
        --model "$model" ${flags[@]+"${flags[@]}"} --epochs "$EPOCHS" --batch-size "$TV_BATCH" --workers "$WORKERS" \
        --log-every 5 --checkpoint-every 0 2>"$OUT/$name.log" >/dev/null; then
      tv_runs+=("$name")
    else
      echo "gpu_check: $model ($strategy) failed:"; tail -5 "$OUT/$name.log"
    fi
  done
else
  echo "== torchvision does not load here: the ResNet-50/ViT-B runs are skipped =="
fi

echo "== results =="
"$PY" - "$OUT" ${tv_runs[@]+"${tv_runs[@]}"} <<'EOF'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for precision in ("bf16", "fp16"):
    for ckpt in ("off", "on"):
        lines = [json.loads(l) for l in (out / f"run-{precision}-ckpt-{ckpt}" / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in lines if r["kind"] == "train"]
        steady = train[1:] or train  # the first window holds start-up and cuDNN autotuning
        val = [r for r in lines if r["kind"] == "val"]
        rows[precision, ckpt] = (statistics.mean(r["samples_per_s"] for r in steady),
                                 max(r["memory_mb"] for r in train),
                                 statistics.mean(r["data_wait_share"] for r in steady), val[-1]["val_loss"])
print(f"{'precision':>9} {'grad ckpt':>9} {'samples/s':>10} {'peak MB':>9} {'data wait':>9} {'val loss':>9}")
for (precision, ckpt), (sps, mem, wait, loss) in rows.items():
    print(f"{precision:>9} {ckpt:>9} {sps:>10.1f} {mem:>9.0f} {wait:>9.0%} {loss:>9.4f}")
for precision in ("bf16", "fp16"):
    (s0, m0, _, _), (s1, m1, _, _) = rows[precision, "off"], rows[precision, "on"]
    print(f"{precision}: checkpointing keeps {m1 / m0:.0%} of the peak memory at {s1 / s0:.0%} of the speed")
print(f"bf16 / fp16 samples/s: {rows['bf16', 'off'][0] / rows['fp16', 'off'][0]:.2f}")
if sys.argv[2:]:
    print(f"\n{'run (bf16, 224 px)':>24} {'samples/s':>10} {'peak MB':>9} {'data wait':>9} {'val loss':>9}")
for name in sys.argv[2:]:
    lines = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    steady = train[1:] or train
    val = [r for r in lines if r["kind"] == "val"]
    print(f"{name[4:]:>24} {statistics.mean(r['samples_per_s'] for r in steady):>10.1f} "
          f"{max(r['memory_mb'] for r in train):>9.0f} {statistics.mean(r['data_wait_share'] for r in steady):>9.0%} "
          f"{val[-1]['val_loss'] if val else float('nan'):>9.4f}")
EOF
