"""`pipe train --objective contrastive` against open_clip's own training script (`open_clip_train.main`)
on the same shards, with the same model, on 2 CPU ranks: samples/s in one run, as a ratio.

The data: a 10-class captioned folder (tests/captioned.py: pictures of a colour, captions in several
languages and legacy encodings, many repeated) through the real `pipe clean` and `pipe shard`
(``--max-count`` small enough that every rank's worker gets shards: open_clip's webdataset reader
splits shards, not samples). open_clip reads those very tar files (``--dataset-type webdataset``,
its ``jpg;png`` and ``txt`` members).

The model: one tiny open_clip configuration (`TINY`: a ViT of 2 layers at 32 px, a text transformer of
2 layers over open_clip's own BPE tokenizer, which ships in its wheel), registered for open_clip's
script from a JSON file (nothing downloaded, no pretrained weights) and built for pipe by `tiny_clip`,
a ``--model package.module:factory`` that wraps the same `open_clip.CLIP` in pipe's contrastive
contract (`train.models.clip`): same architecture, tokenizer, context length and normalisation.

Both run under the same ``torchrun --standalone --nproc-per-node 2`` (gloo, fp32, batch per rank,
1 dataloader worker, AdamW, same lr and epochs), so the kernel's scheduling treats them alike
(`bench/train.py` explains autogroup). Rounds are interleaved, the order reversed every other round.
Measured: training samples/s in steady state (pipe: RUN_DIR/metrics.jsonl windows, the first left
out; open_clip: its per-step log, "Batch (t)", the first two steps left out), and whole-run CPU
seconds per trained sample (getrusage of the waited-for children: torchrun, its ranks, their
workers; start-up and pipe's per-epoch validation included; independent of how much of the machine
each got).

What the two guarantee differs, and the numbers do not show it:

* an epoch: pipe's reader gives every train sample exactly once per epoch to exactly one rank (the
  shards cut into equal spans per rank and worker). open_clip's webdataset path splits *shards*
  over ranks and workers and stops each worker after ``--train-num-samples / (ranks x workers)``
  samples (``with_epoch``): with uneven shards some samples are seen twice in an epoch and others not
  at all, and with ``--dataset-resampled`` shards are drawn with replacement;
* the loss: both take the contrastive loss over the global batch. open_clip's is exact only with
  ``--gather-with-grad`` (given here; its default gathers the other ranks' features without their
  gradients, and ``--local-loss`` changes what each rank's loss holds); pipe's always gathers with
  gradients and scales so N ranks x B equal 1 rank x N·B (tests/train/objectives/test_losses.py).
  pipe also masks identical captions and near-duplicate pairs out of each other's negatives; open_clip
  treats a repeated caption as a negative of itself on another image.

    python bench/contrastive.py --quick      # ~3-6 min on 2 shared cores
    python bench/contrastive.py [--per-class 80] [--epochs 3] [--rounds 2]

open_clip_torch is installed by this script when it is missing (``pip install open_clip_torch``);
where that fails, the bench says so and stops without a figure (exit 0, "skipped").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NAME = "pipe-bench-tiny"
CONTEXT = 32
SIZE = 32
TINY = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": SIZE, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": CONTEXT, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


# -- the model, for pipe (--model bench.contrastive:tiny_clip) ------------------------------------


def tiny_clip(num_classes: int = 0) -> Any:
    """open_clip's CLIP of `TINY` in pipe's contrastive contract (`train.models.clip`)."""
    import open_clip
    import torch
    from torch import nn

    from train.models.clip import scale
    from train.models.norm import InputNorm

    class Tokenize:
        max_len = CONTEXT

        def __init__(self) -> None:
            self.tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=CONTEXT)

        def __call__(self, texts: list[str]) -> dict:
            return {"input_ids": self.tokenizer(texts, context_length=CONTEXT)}

    class OpenClip(nn.Module):
        inputs = ("image", "input_ids")
        text_inputs = ("input_ids",)

        def __init__(self) -> None:
            super().__init__()
            self.clip = open_clip.CLIP(**TINY)
            self.tokenize = Tokenize()
            self.input_norm = InputNorm(OPENAI_MEAN, OPENAI_STD, SIZE, "open_clip (OPENAI_DATASET_MEAN/STD)")
            self.image_size = SIZE
            self.image_tower = self.clip.visual

        @property
        def logit_scale(self) -> torch.Tensor:
            return self.clip.logit_scale

        def encode_image(self, image: torch.Tensor) -> torch.Tensor:
            return self.clip.encode_image(image)

        def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.clip.encode_text(input_ids)

        def forward(self, image: torch.Tensor, input_ids: torch.Tensor) -> dict:
            return {"image": self.encode_image(image), "text": self.encode_text(input_ids),
                    "scale": scale(self.clip.logit_scale.reshape(1)), "bias": None}

    return OpenClip()


# -- open_clip's own script, under torchrun ---------------------------------------------------------


def openclip_entry(config_dir: str, argv: list[str]) -> None:
    """A torchrun rank: `TINY` registered under `NAME`, then open_clip_train's main. Its main wraps the
    model in ``DistributedDataParallel(model, device_ids=[device])``, which torch refuses for a CPU
    module: ``device_ids`` is dropped for a CPU device. And its webdataset grouping predates
    webdataset 1.0's end-of-shard marker (an empty dict it takes for a file: KeyError 'fname'), so
    the marker is switched off (`_without_eof_marker`). These are the only changes to its path."""
    import open_clip
    import torch
    from open_clip_train import main as script

    class CpuDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module: Any, device_ids: Any = None, **kwargs: Any) -> None:
            on_cpu = device_ids and all(torch.device(d).type == "cpu" for d in device_ids)
            super().__init__(module, device_ids=None if on_cpu else device_ids, **kwargs)

    torch.nn.parallel.DistributedDataParallel = CpuDDP  # type: ignore[misc]
    _without_eof_marker()
    open_clip.add_model_config(config_dir)
    script.main(argv)


def _without_eof_marker() -> None:
    """open_clip_train 3.3's `group_by_keys_nothrow` reads every item of webdataset's tar expander
    as a file; webdataset >= 1.0 ends each shard with an empty dict: asked not to (its ``eof_value``)."""
    import functools

    from open_clip_train import data

    expander = getattr(data, "tar_file_expander", None)
    if expander is not None and "eof_value" in getattr(expander, "__code__", type("", (), {"co_varnames": ()})).co_varnames:
        data.tar_file_expander = functools.partial(expander, eof_value=None)


# -- the bench ------------------------------------------------------------------------------------


def _helpers() -> Any:
    """bench/train.py's process-tree CPU polling (loaded by path: its module name is train's)."""
    spec = importlib.util.spec_from_file_location("bench_train", Path(__file__).with_name("train.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def children_cpu() -> float:
    """CPU seconds (user + system) of every process this one started and waited for, and theirs in
    turn (torchrun waits for its ranks, a rank for its dataloader workers): a whole run's CPU."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ensure_open_clip() -> str | None:
    """None when open_clip_torch (and its training script) can be imported, after installing it if
    need be; else why not."""
    if importlib.util.find_spec("open_clip_train") is None:
        p = subprocess.run([sys.executable, "-m", "pip", "install", "open_clip_torch"], capture_output=True, text=True)
        if p.returncode != 0:
            return f"pip install open_clip_torch failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        importlib.invalidate_caches()
    if importlib.util.find_spec("open_clip_train") is None:
        return "open_clip_torch is installed but has no open_clip_train (its training script)"
    return None


def make_data(root: Path, per_class: int, max_count: int) -> tuple[Path, dict]:
    sys.path.insert(0, str(REPO))
    from pipeline.clean import stage as clean
    from pipeline.shard import stage as shard
    from tests.captioned import make_raw

    raw, _ = make_raw(root / "raw", per_class)
    clean.run(clean.CleanConfig(raw, root / "clean", workers=2, size=SIZE, min_size=16), show_progress=False)
    shard.run(shard.ShardConfig(root / "clean", root / "shards", val_fraction=0.1, max_count=max_count, workers=2),
              show_progress=False)
    return root / "shards", json.loads((root / "shards" / "index.json").read_text())


def openclip_steady(log: str, batch: int, world: int, skip: int = 2) -> dict:
    """samples/s and data-wait from open_clip's per-step log lines (the first ``skip`` left out)."""
    steps = re.findall(r"Data \(t\): ([\d.]+) Batch \(t\): ([\d.]+)", log)
    use = [(float(d), float(b)) for d, b in steps][skip:]
    if not use:
        raise SystemExit(f"open_clip logged no training step:\n{log[-3000:]}")
    seconds = sum(b for _, b in use)
    epochs = re.findall(r"Train Epoch: (\d+) \[\s*(\d+)/(\d+)", log)
    return {"samples_per_s": len(use) * batch * world / seconds, "data_wait": sum(d for d, _ in use) / seconds,
            "steps": len(steps), "epoch_samples": int(epochs[0][2]) if epochs else 0}


def main() -> None:
    if sys.argv[1:2] == ["--openclip-rank"]:
        config_dir, *argv = json.loads(Path(sys.argv[2]).read_text())
        openclip_entry(config_dir, argv)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 pictures a class, 2 epochs, 1 round")
    ap.add_argument("--per-class", type=int, default=80)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    a = ap.parse_args()
    per_class, epochs, rounds = (40, 2, 1) if a.quick else (a.per_class, a.epochs, a.rounds)
    why = ensure_open_clip()
    if why:
        print(f"skipped: {why}")
        return
    import open_clip

    h = _helpers()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"before: {h.load()} on {cores} cores; open_clip_torch {open_clip.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        world, workers = 2, 1
        shards, index = make_data(root, per_class, max_count=max(8, per_class * 10 // 8))
        train = [s for s in index["shards"] if s["split"] == "train"]
        n_train = sum(s["count"] for s in train)
        steps = n_train // (world * a.batch_size)
        print(f"data: {n_train} train pairs of {SIZE} px in {len(train)} shards, 10 classes; model {NAME} "
              f"({json.dumps(TINY)}); 2 ranks x batch {a.batch_size}, {workers} worker a rank, {epochs} epochs, fp32, "
              f"{steps} steps an epoch")
        (root / "models").mkdir(exist_ok=True)
        (root / "models" / f"{NAME}.json").write_text(json.dumps(TINY))
        env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        lr = "1e-3"

        def ours(i: int) -> dict:
            run = root / f"pipe{i}"
            cpu = children_cpu()
            wall, _ = h.run_polled([*torchrun, "-m", "pipeline", "train", str(shards), "-o", str(run),
                                        "--objective", "contrastive", "--model", "bench.contrastive:tiny_clip",
                                        "--epochs", str(epochs), "--batch-size", str(a.batch_size), "--workers",
                                        str(workers), "--lr", lr, "--precision", "fp32", "--log-every", "2",
                                        "--checkpoint-every", "0", "--warmup", "0"], env)
            m = h.steady(run)
            samples = epochs * steps * world * a.batch_size
            return {**m, "wall": wall, "cpu_per_sample": (children_cpu() - cpu) / samples,
                    "epoch_samples": steps * world * a.batch_size}

        def theirs(i: int) -> dict:
            logs = root / f"openclip{i}"
            urls = "::".join(str(shards / s["name"]) for s in train)
            args = root / f"openclip{i}.json"  # (torchrun would take --logs for an abbreviation of its own --logs-specs)
            args.write_text(json.dumps([str(root / "models"),
                                        "--train-data", urls, "--dataset-type", "webdataset", "--train-num-samples",
                                        str(n_train), "--model", NAME, "--batch-size", str(a.batch_size), "--epochs",
                                        str(epochs), "--workers", str(workers), "--lr", lr, "--warmup", "0",
                                        "--precision", "fp32", "--device", "cpu", "--dist-backend", "gloo",
                                        "--gather-with-grad", "--log-every-n-steps", "1", "--save-frequency", "0",
                                        "--zeroshot-frequency", "0", "--val-frequency", "0", "--report-to", "",
                                        "--logs", str(logs), "--name", "run", "--seed", "0"]))
            cpu = children_cpu()
            wall, _ = h.run_polled([*torchrun, __file__, "--openclip-rank", str(args)], env)
            log = "\n".join(p.read_text(errors="replace") for p in sorted(logs.rglob("*.log")))
            m = openclip_steady(log, a.batch_size, world)
            samples = m["steps"] * world * a.batch_size
            return {**m, "wall": wall, "cpu_per_sample": (children_cpu() - cpu) / samples}

        ways = {"pipe train": ours, "open_clip_train.main": theirs}
        results: dict[str, list[dict]] = {name: [] for name in ways}
        for i in range(rounds):
            for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                r = ways[name](i)
                results[name].append(r)
                print(f"  round {i + 1}: {name}: {r['samples_per_s']:.1f} samples/s, data wait {r['data_wait']:.1%}, "
                      f"{r['cpu_per_sample'] * 1000:.1f} ms CPU a sample (whole processes), {r['wall']:.0f} s wall "
                      f"({h.load()})", flush=True)
    print(f"after: {h.load()}")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("samples_per_s", "data_wait", "cpu_per_sample", "wall")}
           for n, rs in results.items()}
    print(f"\n{'tiny open_clip CLIP, 2 CPU ranks':>34} {'samples/s':>10} {'data wait':>10} {'CPU ms/sample':>14} "
          f"{'wall s':>8}   (medians of {rounds} round(s))")
    for n, r in med.items():
        print(f"{n:>34} {r['samples_per_s']:>10.1f} {r['data_wait']:>10.1%} {r['cpu_per_sample'] * 1000:>14.1f} "
              f"{r['wall']:>8.1f}")
    ours_m, theirs_m = med["pipe train"], med["open_clip_train.main"]
    print(f"\nsamples an epoch of {n_train}: pipe train {results['pipe train'][0]['epoch_samples']} (each once; the "
          f"{n_train - results['pipe train'][0]['epoch_samples']} left over wait for a later epoch), open_clip "
          f"{results['open_clip_train.main'][0]['epoch_samples']} (--train-num-samples rounded up to whole global "
          "batches, from shards split over ranks and workers: some samples twice)")
    print(f"\npipe train / open_clip: {ours_m['samples_per_s'] / theirs_m['samples_per_s']:.2f}x samples/s, "
          f"{theirs_m['cpu_per_sample'] / ours_m['cpu_per_sample']:.2f}x samples per CPU second")


if __name__ == "__main__":
    main()
