#!/usr/bin/env bash
# One prepared check of pipe train on one GPU: is the accelerator fed? (issue 26, item 2)
#
#   bench/gpu_check.sh                     # ~6 min on one H100 (16 cores); stops itself after $BUDGET s
#   STEPS=60 IMAGES=4096 bench/gpu_check.sh    # a quicker look
#   FULL=1 bench/gpu_check.sh              # also the built-in model's bf16/fp16 x checkpointing runs
#                                          # and ViT-B/16 under --strategy fsdp (~4 min more: raise BUDGET)
#   bench/gpu_check.sh --summary DIR       # print the tables again from a finished check's folder
#   bench/gpu_check.sh --preflight         # only check that pipe's dependencies import (a CPU will do)
#   IMAGES=64 bench/gpu_check.sh --data    # only that, and build the data (a CPU will do: flags, timeouts)
#
# Without a GPU it says "gpu_check: skipped: no GPU" and exits 0: nothing here can be judged on a CPU.
#
# Python: $PYTHON, else this checkout's .venv, else python3 (on this workplace's GPU machines the
# python3 that holds torch and torchvision), else python. pipe's own dependencies that such a
# machine lacks (simplejpeg, cykooz-resizer, webdataset, jsonschema, ...) travel as wheels in .whl/
# (bench/gpu_wheels.sh downloads them here, where pip can reach PyPI; GPU_CHECK_WHEELS names another
# folder); this script installs them into $WORK/site when there are any, and checks every import
# before spending time on data (`bench/gpu_check.sh --preflight` runs that check alone, on a CPU too).
#
# Time: one budget, BUDGET seconds (default 480) from the start; every step runs under `timeout`
# (a hung NCCL or dataloader ends that step, not the whole allowance), a step that no longer fits
# is skipped and said so, and the tables are printed from what finished. Under a 10-minute command
# limit give it timeout_s >= BUDGET + 60.
#
# What it does, in order, all from local shards it builds itself in $WORK (GPU_CHECK_DIR, default a
# new temp folder; never $OUT, which a device tool may copy back: shards and checkpoints are GBs):
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
#    While each runs, nvidia-smi samples the GPU's utilisation (with its own timestamps); the steady
#    windows (metrics rows after the first, each within one epoch: a window across an epoch's end
#    holds the wait for the new epoch's first batches) give "busy" (goal >= 90%: nvidia-smi's
#    utilization.gpu, the share of time a kernel ran, not how full the SMs were) and metrics.jsonl's
#    data wait (goal < 5%).
# Outputs stay in $WORK for a look at metrics.jsonl, gpu-*.txt (utilisation samples) and the logs;
# everything to judge the check by is printed (on a device tool: `bench/gpu_check.sh 2>&1 | tee $OUT/log`).
#
# Written to be correct by reading and checked on a CPU only (bash -n; the no-GPU skip; --summary
# on made-up metrics): its first run on a GPU belongs in issue 26's closing note.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
elif command -v python3 >/dev/null; then PY=python3
else PY=python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

summary() {  # the tables, from a check's folder ($1): every run-* that finished
"$PY" - "$1" <<'EOF'
import json, statistics, sys
from datetime import datetime
from pathlib import Path

out = Path(sys.argv[1])
BUSY, WAIT = 0.90, 0.05  # the goals: GPU busy >= 90% of the steady window, data wait < 5% of step time


def rows(run):
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]


def steady(train):
    """The rows whose window lies within one epoch, after the first: the first holds start-up,
    cuDNN autotuning and the first batches, and a window that crosses an epoch's end holds the
    workers' wait for the new epoch's first batches (a data wait of each epoch, not of the steady
    state the goals are about). As `busy`'s windows."""
    return [b for a, b in zip(train, train[1:]) if a["epoch"] == b["epoch"]] or train[1:] or train


def busy(run, train):
    """Mean GPU utilisation (nvidia-smi's %, 0-100, as a share) over the steady windows: each pair
    of consecutive metrics rows of one epoch (a window across an epoch's end holds its checkpoint)."""
    path = out / f"gpu-{run.name}.txt"
    if not path.is_file():
        return None
    windows = [(a["time"], b["time"]) for a, b in zip(train, train[1:]) if a["epoch"] == b["epoch"]]
    samples = []
    for line in path.read_text().splitlines():
        t, u = sample(line)
        if t is not None and u is not None and any(start < t <= end for start, end in windows):
            samples.append(u)
    return statistics.mean(samples) / 100 if samples else None


def sample(line):
    """(unix seconds, utilisation %) of one nvidia-smi line "YYYY/MM/DD HH:MM:SS.mmm, 57": its
    own timestamp, in local time as time.time()'s rows are compared in it (a stamp taken when
    the line was read would be the time a pipe's buffer was flushed); (None, None) for "[N/A]"."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 2:
        return None, None
    try:
        return datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(parts[1])
    except ValueError:
        return None, None


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
    sps = statistics.mean(r["samples_per_s"] for r in steady(train))
    wait = statistics.mean(r["data_wait_share"] for r in steady(train))
    b = busy(run, train)
    ok = (b is not None and b >= BUSY) and wait < WAIT
    if not ok:
        missed.append(run.name)
    print(f"{run.name[4:]:>30} {train[-1]['step']:>6} {sps:>10.1f} {'n/a' if b is None else f'{b:.0%}':>6} {wait:>9.1%} "
          f"{max(r['memory_mb'] for r in train):>8.0f}  {'meets' if ok else 'MISSES'}")
for name in ("resnet50", "vit_b_16"):
    cpu, gpu = rows(out / f"run-{name}-decode-cpu"), rows(out / f"run-{name}-decode-gpu")
    if cpu[1:] and gpu[1:]:
        c = statistics.mean(r["samples_per_s"] for r in steady(cpu))
        g = statistics.mean(r["samples_per_s"] for r in steady(gpu))
        print(f"{name}: --decode gpu / --decode cpu samples/s = {g / c:.2f}")
print(f"runs missing a goal: {', '.join(m[4:] for m in missed) if missed else 'none'}")
EOF
}

preflight() {  # pipe's dependencies (from $GPU_CHECK_WHEELS, default .whl/, when it holds any) importable? Says what is missing; 1 if any
  local wheels=${GPU_CHECK_WHEELS:-.whl}
  if compgen -G "$wheels/*.whl" >/dev/null; then
    echo "== pipe's dependencies: the wheels in $wheels/ -> $WORK/site =="
    if PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$wheels"/*.whl 2>&1 | tail -3; then
      export PYTHONPATH="$PYTHONPATH:$WORK/site"
    else  # the imports below say whether this Python has what it needs anyway
      echo "gpu_check: installing $wheels/*.whl failed (wheels for another Python? see bench/gpu_wheels.sh)"
    fi
  fi
  "$PY" - <<'EOF'
"""Every runtime dependency pyproject.toml names (and torchvision, for torchvision:NAME and nvJPEG):
installed, at a version it allows, and its modules importable; one line for all that are not."""
import importlib, importlib.metadata as md, re, sys

try:
    import tomllib
except ImportError:  # Python 3.10: the imports below still run
    tomllib = None
try:
    from packaging.requirements import Requirement
except ImportError:
    Requirement = None

wanted = ["torchvision>=0.19"]
if tomllib is not None:
    with open("pyproject.toml", "rb") as f:
        wanted += tomllib.load(f)["project"]["dependencies"]
modules = md.packages_distributions()  # module -> distributions
problems = []
for spec in wanted:
    if Requirement is not None:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name, allowed = req.name, req.specifier
    else:
        name, allowed = re.split(r"[<>=!~; ]", spec, maxsplit=1)[0], None
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        problems.append(f"{name} (not installed)")
        continue
    if allowed is not None and not allowed.contains(version, prereleases=True):
        problems.append(f"{name} {version} (pyproject.toml asks {allowed})")
        continue
    norm = re.sub(r"[-_.]+", "_", name).lower()
    # its main module: the one named as it is (xxhash), else the shortest it installs (pillow: PIL)
    mine = sorted((m for m, dists in modules.items() if m.isidentifier() and not m.startswith("_")
                   and any(re.sub(r"[-_.]+", "_", d).lower() == norm for d in dists)), key=lambda m: (m != norm, len(m)))
    if mine:
        try:
            importlib.import_module(mine[0])
        except Exception as e:  # noqa: BLE001 - any failure to import is the finding
            problems.append(f"{name} {version} (import {mine[0]}: {type(e).__name__}: {e})")
# nvJPEG's module, and pipe's own modules this check runs
for module in ("torchvision.io", "pipeline.cli.app", "train.data.device", "train.data.reader"):
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        problems.append(f"{module} ({type(e).__name__}: {e})")
if problems:
    sys.exit("gpu_check: missing or unusable here: " + "; ".join(problems) + ". On a machine without PyPI, bring "
             "them as wheels: run bench/gpu_wheels.sh where pip reaches PyPI, carry .whl/ along, run again")
import torch, torchvision
print(f"dependencies: ok (python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__})")
EOF
}

if [ "${1:-}" = "--summary" ]; then
  summary "${2:?usage: bench/gpu_check.sh --summary DIR}"
  exit 0
fi

IMAGES=${IMAGES:-8192}
STEPS=${STEPS:-150}
BATCH=${BATCH:-128}
VIT_BATCH=${VIT_BATCH:-128}
BUDGET=${BUDGET:-480}        # seconds for the whole check, start to tables
RUN_LIMIT=${RUN_LIMIT:-120}  # seconds at most for one pipe train run (start-up, 150 steps, checkpoints)
CORES=$(nproc)
WORKERS=${WORKERS:-$(( CORES > 3 ? CORES - 2 : 1 ))}  # dataloader workers: the cores less the rank and a spare
WORK=${GPU_CHECK_DIR:-$(mktemp -d -t pipe-gpu-check.XXXXXX)}
mkdir -p "$WORK"
DEADLINE=$(( SECONDS + BUDGET ))

within() {  # within WHAT LIMIT CMD...: CMD under timeout, cut at LIMIT s or at what is left of BUDGET
  local what=$1 limit=$2 t rc=0  # (less 20 s kept for the tables); a step that no longer fits is skipped
  shift 2
  t=$(( DEADLINE - SECONDS - 20 ))
  if [ "$t" -gt "$limit" ]; then t=$limit; fi
  if [ "$t" -lt 15 ]; then
    echo "gpu_check: $what: skipped: out of time (BUDGET=$BUDGET s)"
    return 125
  fi
  timeout -k 15 "$t" "$@" || rc=$?  # its own process group: the ranks and their workers are signalled too
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "gpu_check: $what: cut at its limit of $t s"; fi
  return "$rc"
}

if [ "${1:-}" = "--preflight" ]; then  # the dependency check alone: runs on a CPU too
  preflight
  exit $?
fi

if [ "${1:-}" != "--data" ]; then  # --data: the dependencies and the data alone, on a CPU too (flags, timeouts)
echo "== the machine =="
rc=0
within "the GPU and NCCL check" 90 "$PY" - <<'EOF' || rc=$?
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
if [ "$rc" = 3 ]; then  # skipped: no GPU (said above)
  if [ -z "${GPU_CHECK_DIR:-}" ]; then rmdir "$WORK" 2>/dev/null || true; fi
  exit 0
fi
if [ "$rc" != 0 ]; then echo "gpu_check: the GPU or NCCL check failed (exit $rc)"; exit 1; fi
# the dataloader workers' batch slots live in /dev/shm: 3 per worker, BATCH x 224 x 224 x 3 bytes each
need=$(( WORKERS * 3 * BATCH * 224 * 224 * 3 / 1048576 ))
shm=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
echo "/dev/shm: ${shm:-?} MB free; the training runs' batch slots take ~$need MB"
if [ -n "$shm" ] && [ "$shm" -lt $(( need * 2 )) ]; then
  echo "gpu_check: /dev/shm may be too small for $WORKERS workers (set WORKERS lower, or BATCH)"
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
else
  echo "gpu_check: nvidia-smi is missing: utilisation is not measured (busy n/a)"
fi
fi
preflight || exit 1

echo "== data: $IMAGES images of 512 px -> pipe clean -> pipe shard; a captioned set (in $WORK) =="
within "the data" 180 "$PY" - "$WORK" "$IMAGES" "$CORES" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
import loader  # bench/loader.py: seeded photo-like 512 px JPEGs -> pipe clean -> pipe shard --val-fraction 0
out, images, cores = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
loader.build(out / "data", images, 10, 0, cores, 1000)
EOF
SHARDS="$WORK/data/shards"
within "the captioned set" 60 "$PY" -c "
from pathlib import Path
from tests.captioned import make_raw
make_raw(Path('$WORK/captioned-raw'), 200)
"
within "pipe clean (captioned)" 60 "$PY" -m pipeline clean "$WORK/captioned-raw" -o "$WORK/captioned-clean" --size 48 \
  --workers "$CORES" >/dev/null  # its 48 px pictures
within "pipe shard (captioned)" 60 "$PY" -m pipeline shard "$WORK/captioned-clean" -o "$WORK/captioned" --val-fraction 0.1 \
  --workers "$CORES" >/dev/null

if [ "${1:-}" = "--data" ]; then echo "gpu_check: data built in $WORK (--data: no GPU steps)"; exit 0; fi

echo "== the device path alone: DeviceFeed on the GPU, --decode cpu vs --decode gpu =="
# a failure here is reported and the training runs still run: they are most of what this check is for
within "the device path" 120 "$PY" - "$SHARDS" "$WORKERS" "$BATCH" <<'EOF' || echo "gpu_check: the device path check failed (above)"
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
start_sampler() {  # nvidia-smi's utilisation every 200 ms, each line "YYYY/MM/DD HH:MM:SS.mmm, percent", into $1
  sampler=""
  command -v nvidia-smi >/dev/null || return 0
  # nvidia-smi's own timestamp: a stamp taken by a reader of its pipe would be the buffer's flush time;
  # line-buffered where stdbuf is there, so that stopping it loses no block of samples still unwritten
  local line=()
  if command -v stdbuf >/dev/null; then line=(stdbuf -oL); fi
  ${line[@]+"${line[@]}"} nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 200 >"$1" 2>/dev/null &
  sampler=$!
}
stop_sampler() {
  [ -n "$sampler" ] || return 0
  kill -INT "$sampler" 2>/dev/null || true  # as Ctrl-C: nvidia-smi's loop ends as it is meant to
  sleep 0.5
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sampler=""
}
trap stop_sampler EXIT

train() {  # train NAME ARGS...: one pipe train on the GPU, NCCL x 1, $precision (bf16); its log and utilisation kept
  local name=$1; shift
  echo "== pipe train: $name =="
  start_sampler "$WORK/gpu-run-$name.txt"
  local rc=0
  within "pipe train $name" "$RUN_LIMIT" "$PY" -m pipeline train "$@" -o "$WORK/run-$name" --nproc-per-node 1 \
      --backend nccl --precision "${precision:-bf16}" --workers "$WORKERS" --log-every 10 --checkpoint-every 0 \
      --max-steps "${steps:-$STEPS}" --epochs 1000 2>"$WORK/run-$name.log" >/dev/null || rc=$?
  stop_sampler
  if [ "$rc" = 0 ]; then
    grep -q "backend nccl" "$WORK/run-$name.log" || echo "gpu_check: $name did not say it ran over nccl (see $WORK/run-$name.log)"
  elif [ "$rc" != 125 ]; then  # 125: skipped for time, said so
    echo "gpu_check: $name failed (exit $rc):"; tail -5 "$WORK/run-$name.log"
  fi
}

for decode in cpu gpu; do
  train "resnet50-decode-$decode" "$SHARDS" --model torchvision:resnet50 --batch-size "$BATCH" --decode "$decode"
  train "vit_b_16-decode-$decode" "$SHARDS" --model torchvision:vit_b_16 --batch-size "$VIT_BATCH" --decode "$decode"
done

# the contrastive objective (issue 22), where this pipe train has it
if "$PY" -m pipeline train --help 2>/dev/null | grep -q -- "--objective"; then
  # a small set (2000 pairs, 48 px): fewer steps, so fewer epoch ends (each validates and checkpoints)
  steps=$(( STEPS < 60 ? STEPS : 60 )) train "contrastive-clip" "$WORK/captioned" --objective contrastive --model clip \
    --batch-size 128
else
  echo "== this pipe train has no --objective: the contrastive run is skipped =="
fi

if [ "${FULL:-0}" = 1 ]; then  # the earlier check's runs: precision x gradient checkpointing, FSDP
  for precision in bf16 fp16; do
    for ckpt in off on; do
      flags=(--model image --width 64 --resolution 224 --batch-size "$BATCH")
      if [ "$ckpt" = on ]; then flags+=(--grad-checkpoint); fi
      train "builtin-$precision-ckpt-$ckpt" "$SHARDS" "${flags[@]}"
    done
  done
  precision=bf16
  train "vit_b_16-fsdp" "$SHARDS" --model torchvision:vit_b_16 --batch-size "$VIT_BATCH" --strategy fsdp
fi

echo "== results (steady: the metrics windows within an epoch, after the first; $WORKERS workers, $(nproc) cores; $SECONDS s) =="
summary "$WORK" || true
echo "outputs: $WORK"
