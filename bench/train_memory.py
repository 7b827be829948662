"""Peak memory per rank, --strategy ddp against --strategy fsdp, for a ~300M-parameter model on
2 CPU gloo ranks: the issue's target is FSDP at most 0.6 of DDP.

Each rank runs what `pipe train` runs for a step (`train.distributed.group.wrap` or
`train.distributed.fsdp.shard`, `train.components.optimizer.make_optimizer` (AdamW), forward,
backward, gradient clipping, step) on a stack of MLP blocks with synthetic inputs; no data
pipeline, whose memory is the same under both strategies. Two numbers per rank:

* peak RSS of the process (``ru_maxrss``): everything, including building the full model, which
  `pipe train` does on every rank before sharding it;
* training peak: the RSS high-water mark over the steps alone (reset through
  /proc/self/clear_refs after the model is built, wrapped or sharded, and the optimizer made).

What to expect per rank, fp32: DDP holds weights, gradients and AdamW's two moments whole (16
bytes per parameter: ~4.8 GB at 300M); FSDP holds a 1/world share of each plus one gathered
block at a time (~2.4 GB on 2 ranks). The strategies run one after the other, never at once.

    python bench/train_memory.py --params 20e6          # a quick check, well under a GB per rank
    python bench/train_memory.py                         # 300M: ~10 GB for the DDP ranks together
    python bench/train_memory.py --strategy fsdp --steps 2 --ranks 2 --params 300e6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(field: str) -> float:
    """VmRSS / VmHWM of this process from /proc/self/status, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    """Reset the RSS high-water mark (Linux: '5' to clear_refs); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def build(params: float, width: int, classes: int = 10):
    """MLP blocks (LayerNorm, width -> 4 width -> width, residual) up to ``params`` parameters, and a
    head; ``block_groups`` names the blocks, as pipe's models do for --freeze and FSDP."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))

    class Stack(nn.Module):
        def __init__(self, depth: int):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(depth))
            self.head = nn.Linear(width, classes)

        def block_groups(self):
            return [list(self.blocks)]

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    per_block = 8 * width * width + 7 * width
    return Stack(max(1, round(params / per_block)))


def rank_main(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    sys.path.insert(0, str(REPO))
    import torch
    import torch.nn.functional as F

    from train.components.optimizer import make_optimizer
    from train.config import TrainConfig
    from train.distributed import fsdp
    from train.distributed import group as distributed

    torch.set_num_threads(1)
    with distributed.process_group("gloo") as d:
        base = _rss_mb("VmRSS")
        torch.manual_seed(0)
        model = build(args.params, args.width)
        n_params = sum(p.numel() for p in model.parameters())
        wrapped = fsdp.shard(model, d, "fp32") if args.strategy == "fsdp" else distributed.wrap(model, d)
        optimizer = make_optimizer(model, TrainConfig(lr=1e-4))
        reset = _reset_peak()
        g = torch.Generator().manual_seed(rank)
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            x = torch.randn(args.batch, args.width, generator=g)
            y = torch.randint(0, 10, (args.batch,), generator=g)
            F.cross_entropy(wrapped(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
        result = {"rank": rank, "strategy": args.strategy, "params": n_params, "base_mb": base,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_peak_mb": _rss_mb("VmHWM") if reset else None, "step_s": times}
    Path(out, f"{args.strategy}-rank{rank}.json").write_text(json.dumps(result))


def run(strategy: str, args) -> list[dict]:
    import torch.multiprocessing as mp

    out = tempfile.mkdtemp(prefix="pipe-train-memory-")
    run_args = argparse.Namespace(**{**vars(args), "strategy": strategy})
    mp.start_processes(rank_main, args=(args.ranks, _free_port(), run_args, out), nprocs=args.ranks, start_method="spawn")
    return [json.loads(Path(out, f"{strategy}-rank{r}.json").read_text()) for r in range(args.ranks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=300e6, help="model size in parameters (default 300e6)")
    ap.add_argument("--width", type=int, default=2048, help="block width (a block has ~8 x width^2 parameters)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--strategy", choices=("both", "ddp", "fsdp"), default="both")
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for strategy in (("ddp", "fsdp") if args.strategy == "both" else (args.strategy,)):
        for r in run(strategy, args):
            rows.append(r)
            train_peak = f"{r['train_peak_mb']:.0f}" if r["train_peak_mb"] is not None else "n/a"
            print(f"{strategy:5s} rank {r['rank']}: {r['params'] / 1e6:.0f}M params, peak RSS {r['peak_mb']:.0f} MB "
                  f"(training {train_peak} MB, after import {r['base_mb']:.0f} MB), "
                  f"step {min(r['step_s']):.2f}-{max(r['step_s']):.2f} s", flush=True)
    by = {s: max(r["peak_mb"] for r in rows if r["strategy"] == s) for s in {r["strategy"] for r in rows}}
    if len(by) == 2:
        train = {s: max(r["train_peak_mb"] or 0 for r in rows if r["strategy"] == s) for s in by}
        print(f"fsdp / ddp, worst rank: peak RSS {by['fsdp'] / by['ddp']:.2f}"
              + (f", training peak {train['fsdp'] / train['ddp']:.2f}" if all(train.values()) else "")
              + " (target: at most 0.6)")
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
