#!/usr/bin/env bash
# One prepared check of pipe train on one GPU: is the accelerator fed? (issue 26, item 2)
#
#   bench/gpu_check.sh                     # ~6 min on one H100 (16 cores); nothing but a GPU needed
#   STEPS=60 IMAGES=4096 bench/gpu_check.sh    # a quicker look
#   FULL=1 bench/gpu_check.sh              # also the built-in model's bf16/fp16 x checkpointing runs
#                                          # and ViT-B/16 under --strategy fsdp (~4 min more)
#   bench/gpu_check.sh --summary OUT       # print the tables again from a finished check's folder
#
# Without a GPU it says "gpu_check: skipped: no GPU" and exits 0: nothing here can be judged on a CPU.
#
# What it does, in order, all from local shards it builds itself in $OUT (default: a new temp folder):
# 1. The machine: GPU, driver, torch/CUDA/cuDNN/NCCL versions, bf16.
# 2. NCCL at world size 1: init, all_reduce, barrier, destroy (a broken NCCL/driver pairing fails here).
# 3. Data: $IMAGES seeded 512 px photo-like JPEGs (bench/loader.py's) -> pipe clean -> pipe shard,
#    and a small captioned set (tests/captioned.py) for the contrastive run.
# 4. The device path alone (train/data/device.py): the same batches read with --decode cpu and
#    --decode gpu (nvJPEG) through DeviceFeed on the GPU: the same keys in the same order, the pixel
#    difference of the two decoders, and each path's samples/s with the loader alone.
# 5. pipe train --nproc-per-node 1 --backend nccl --precision bf16, --max-steps $STEPS each:
#    torchvision ResNet-50 and ViT-B/16 (random init: the speed is the same) at 224 px, each with
#    --decode cpu and --decode gpu; then --objective contrastive (--model clip) when this pipe has it.
#    While each runs, nvidia-smi samples the GPU's utilisation; the steady window (from the second
#    metrics row to the last) gives "busy" (goal >= 90%) and metrics.jsonl's data wait (goal < 5%).
# Outputs stay in $OUT for a look at metrics.jsonl, gpu-*.txt (utilisation samples) and the logs.
#
# Written to be correct by reading and checked on a CPU only (bash -n; the no-GPU skip; --summary
# on made-up metrics): its first run on a GPU belongs in issue 26's closing note.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

summary() {  # the tables, from a check's folder ($1): every run-* that finished
"$PY" - "$1" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
BUSY, WAIT = 0.90, 0.05  # the goals: GPU busy >= 90% of the steady window, data wait < 5% of step time


def rows(run):
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]


def busy(run, train):
    """Mean GPU utilisation (nvidia-smi's %, 0-100, as a share) over the steady windows: each pair
    of consecutive metrics rows of one epoch (a window across an epoch's end holds its checkpoint)."""
    path = out / f"gpu-{run.name}.txt"
    if not path.is_file():
        return None
    windows = [(a["time"], b["time"]) for a, b in zip(train, train[1:]) if a["epoch"] == b["epoch"]]
    samples = []
    for line in path.read_text().splitlines():
        parts = line.replace(",", " ").split()
        if len(parts) >= 2:
            try:
                t, u = float(parts[0]), float(parts[1])
            except ValueError:  # "[N/A]" and the like
                continue
            if any(start < t <= end for start, end in windows):
                samples.append(u)
    return statistics.mean(samples) / 100 if samples else None


runs = sorted(p for p in out.glob("run-*") if p.is_dir())
if not runs:
    sys.exit(f"gpu_check: no finished runs in {out}")
print(f"{'run':>30} {'steps':>6} {'samples/s':>10} {'busy':>6} {'data wait':>9} {'peak MB':>8}  goals (busy >= 90%, wait < 5%)")
missed = []
for run in runs:
    train = rows(run)
    if not train:
        print(f"{run.name[4:]:>30}  no metrics (see {run}.log)")
        missed.append(run.name)
        continue
    steady = train[1:] or train  # the first window holds start-up, cuDNN autotuning and the first batches
    sps = statistics.mean(r["samples_per_s"] for r in steady)
    wait = statistics.mean(r["data_wait_share"] for r in steady)
    b = busy(run, train)
    ok = (b is not None and b >= BUSY) and wait < WAIT
    if not ok:
        missed.append(run.name)
    print(f"{run.name[4:]:>30} {train[-1]['step']:>6} {sps:>10.1f} {'n/a' if b is None else f'{b:.0%}':>6} {wait:>9.1%} "
          f"{max(r['memory_mb'] for r in train):>8.0f}  {'meets' if ok else 'MISSES'}")
for name in ("resnet50", "vit_b_16"):
    cpu, gpu = rows(out / f"run-{name}-decode-cpu"), rows(out / f"run-{name}-decode-gpu")
    if cpu[1:] and gpu[1:]:
        c = statistics.mean(r["samples_per_s"] for r in cpu[1:])
        g = statistics.mean(r["samples_per_s"] for r in gpu[1:])
        print(f"{name}: --decode gpu / --decode cpu samples/s = {g / c:.2f}")
print(f"runs missing a goal: {', '.join(m[4:] for m in missed) if missed else 'none'}")
EOF
}

if [ "${1:-}" = "--summary" ]; then
  summary "${2:?usage: bench/gpu_check.sh --summary OUT}"
  exit 0
fi

IMAGES=${IMAGES:-8192}
STEPS=${STEPS:-150}
BATCH=${BATCH:-128}
VIT_BATCH=${VIT_BATCH:-128}
CORES=$(nproc)
WORKERS=${WORKERS:-$(( CORES > 3 ? CORES - 2 : 1 ))}  # dataloader workers: the cores less the rank and a spare
OUT=${OUT:-$(mktemp -d -t pipe-gpu-check.XXXXXX)}
mkdir -p "$OUT"

echo "== the machine =="
set +e
"$PY" - <<'EOF'
import os, sys
import torch
if not torch.cuda.is_available():
    print(f"gpu_check: skipped: no GPU (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
          "nothing here can be judged on a CPU")
    sys.exit(3)
import torch.distributed as dist
nccl = torch.cuda.nccl.version()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {'.'.join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}, {torch.cuda.get_device_name(0)}, "
      f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}, {os.cpu_count()} CPUs")
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
rc=$?
set -e
if [ "$rc" = 3 ]; then exit 0; fi  # skipped: no GPU (said above)
if [ "$rc" != 0 ]; then echo "gpu_check: the GPU or NCCL check failed (exit $rc)"; exit 1; fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
else
  echo "gpu_check: nvidia-smi is missing: utilisation is not measured (busy n/a)"
fi

echo "== data: $IMAGES images of 512 px -> pipe clean -> pipe shard; a captioned set (in $OUT) =="
"$PY" - "$OUT" "$IMAGES" "$CORES" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
import loader  # bench/loader.py: seeded photo-like 512 px JPEGs -> pipe clean -> pipe shard --val-fraction 0
out, images, cores = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
loader.build(out / "data", images, 10, 0, cores, 1000)
EOF
SHARDS="$OUT/data/shards"
"$PY" -c "
from pathlib import Path
from tests.captioned import make_raw
make_raw(Path('$OUT/captioned-raw'), 200)
"
"$PY" -m pipeline clean "$OUT/captioned-raw" -o "$OUT/captioned-clean" --size 48 --workers "$CORES" >/dev/null  # its 48 px pictures
"$PY" -m pipeline shard "$OUT/captioned-clean" -o "$OUT/captioned" --val-fraction 0.1 --workers "$CORES" >/dev/null

echo "== the device path alone: DeviceFeed on the GPU, --decode cpu vs --decode gpu =="
"$PY" - "$SHARDS" "$WORKERS" "$BATCH" <<'EOF'
import sys, time
import torch
from train.data.device import DeviceFeed
from train.data.reader import ShardReader, close_loader, make_loader

if not torch.cuda.is_available():
    sys.exit(print("gpu_check: device path: skipped: no GPU"))
shards, workers, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev = torch.device("cuda", 0)
got = {}
for decode in ("cpu", "gpu"):
    reader = ShardReader(shards, "train", 0, 1, batch_size=batch, seed=0, fields=("image",), image_size=224,
                         normalize=False, decode=decode)
    loader = make_loader(reader, workers, pin_memory=True)
    reader.set_epoch(0)
    keys, images, n = [], [], 0
    t = time.perf_counter()
    for b in DeviceFeed(loader, dev, reader):
        assert b["image"].device.type == "cuda" and b["image"].dtype == torch.float32, (b["image"].device, b["image"].dtype)
        keys += b["key"]
        n += len(b["key"])
        if len(images) < 4:
            images.append(b["image"].float().cpu())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    close_loader(loader)
    got[decode] = keys, torch.cat(images), n / seconds
    print(f"  --decode {decode}: {n} samples, {n / seconds:,.0f} samples/s through the loader alone ({workers} workers)")
assert got["cpu"][0] == got["gpu"][0], "the two decode paths read other samples or another order"
std = torch.tensor(ShardReader(shards, "train").index["std"]).view(1, 3, 1, 1)
levels = ((got["cpu"][1] - got["gpu"][1]) * std * 255).abs()  # back to 0-255 pixel levels
print(f"  the same {len(got['cpu'][0])} keys in the same order: ok; nvJPEG + bicubic vs libjpeg-turbo DCT + Lanczos-3: "
      f"{levels.mean():.2f} levels on average, {levels.max():.0f} at most")
print(f"  --decode gpu / --decode cpu, loader alone: {got['gpu'][2] / got['cpu'][2]:.2f}x")
EOF

sampler=""
start_sampler() {  # nvidia-smi's utilisation every 200 ms, each line "unix-seconds percent", into $1
  sampler=""
  command -v nvidia-smi >/dev/null || return 0
  ( nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 \
      | while read -r u; do echo "$(date +%s.%N) $u"; done >"$1" ) &
  sampler=$!
}
stop_sampler() {
  [ -n "$sampler" ] || return 0
  pkill -P "$sampler" 2>/dev/null || true  # the nvidia-smi and the loop of that subshell, no other
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sampler=""
}
trap stop_sampler EXIT

train() {  # train NAME ARGS...: one pipe train on the GPU, NCCL x 1, $precision (bf16); its log and utilisation kept
  local name=$1; shift
  echo "== pipe train: $name =="
  start_sampler "$OUT/gpu-run-$name.txt"
  if "$PY" -m pipeline train "$@" -o "$OUT/run-$name" --nproc-per-node 1 --backend nccl --precision "${precision:-bf16}" \
      --workers "$WORKERS" --log-every 10 --checkpoint-every 0 --max-steps "${steps:-$STEPS}" --epochs 1000 \
      2>"$OUT/run-$name.log" >/dev/null; then
    grep -q "backend nccl" "$OUT/run-$name.log" || echo "gpu_check: $name did not say it ran over nccl (see $OUT/run-$name.log)"
  else
    echo "gpu_check: $name failed:"; tail -5 "$OUT/run-$name.log"
  fi
  stop_sampler
}

for decode in cpu gpu; do
  train "resnet50-decode-$decode" "$SHARDS" --model torchvision:resnet50 --batch-size "$BATCH" --decode "$decode"
  train "vit_b_16-decode-$decode" "$SHARDS" --model torchvision:vit_b_16 --batch-size "$VIT_BATCH" --decode "$decode"
done

# the contrastive objective (issue 22), where this pipe train has it
if "$PY" -m pipeline train --help 2>/dev/null | grep -q -- "--objective"; then
  # a small set (2000 pairs, 48 px): fewer steps, so fewer epoch ends (each validates and checkpoints)
  steps=$(( STEPS < 60 ? STEPS : 60 )) train "contrastive-clip" "$OUT/captioned" --objective contrastive --model clip \
    --batch-size 128
else
  echo "== this pipe train has no --objective: the contrastive run is skipped =="
fi

if [ "${FULL:-0}" = 1 ]; then  # the earlier check's runs: precision x gradient checkpointing, FSDP
  for precision in bf16 fp16; do
    for ckpt in off on; do
      flags=(--model image --width 64 --resolution 224 --batch-size "$BATCH")
      [ "$ckpt" = on ] && flags+=(--grad-checkpoint)
      train "builtin-$precision-ckpt-$ckpt" "$SHARDS" "${flags[@]}"
    done
  done
  precision=bf16
  train "vit_b_16-fsdp" "$SHARDS" --model torchvision:vit_b_16 --batch-size "$VIT_BATCH" --strategy fsdp
fi

echo "== results (steady: metrics rows after the first; busy: within an epoch's windows; $WORKERS workers, $(nproc) cores) =="
summary "$OUT"
echo "outputs: $OUT"
