"""How well `pipe labels` finds wrong labels, on a real labelled image set with labels we flipped.

The data: scikit-learn's handwritten digits (`sklearn.datasets.load_digits`: 1,797 scans of 8x8
pixels, 10 classes, shipped inside the scikit-learn wheel, nothing downloaded). Each condition
flips a share of the labels, writes the images into class folders under the *given* label
(upscaled to 32 px: `pipe clean` refuses thumbnails), then runs the real commands, each as its
own process: `pipe clean` -> `pipe shard` -> `pipe train` (CPU) -> `pipe labels`, and compares the
flagged set with the flips:

* precision: the share of flagged samples whose label was flipped;
* recall: the share of flipped samples that were flagged;
* with no flips at all: the share of samples flagged (every one a false alarm).

Conditions: 0%, 5% and 10% flipped uniformly (to any other class), and 10% flipped between
confusable pairs (1<->7, 3<->8, 4<->9, 5<->6, 0<->2: a plausible annotator's mistake, harder
to tell from the digit's own ambiguity). Targets (issue 13): precision and recall >= 0.8 at 10%,
<= 3% flagged with no flips.

cleanlab's `find_label_issues` (the reference implementation of confident learning) runs on the
same validation predictions, when it is installed, to compare with our own implementation: the
val samples each flags, against the flips.

    python bench/label_noise.py                 # every condition, ~3 min each on 2 shared cores
    python bench/label_noise.py --noise 0.1     # one uniform condition
    PYTHONPATH=DIR python bench/label_noise.py  # DIR: where scikit-learn (and cleanlab) are installed

Measured (2 shared cores, load ~11, seed 0, val 30%, 8 epochs; ~2-4 min per condition):

    condition        flipped flagged est.rate precision  recall flagged%  CL val P/R (ours)  cleanlab val P/R
    uniform 0%             0       0    0.000       nan     nan     0.0%            nan/nan           nan/nan
    uniform 5%            90      91    0.052      0.93    0.94     5.1%          0.92/0.83         0.93/0.86
    uniform 10%          180     168    0.098      0.99    0.92     9.3%          1.00/0.87         0.98/0.88
    pairs 10%            180     202    0.112      0.86    0.97    11.2%          0.93/0.90         0.93/0.90

With `pipe shard`'s default 10% val split (180 samples) the 10% uniform rate came out 5.6% (the
val split held 12 flips, 6.7%): precision 1.00 but recall 0.55. The count is only as good as the
rate, hence the 30% default here and the interval `pipe labels` prints.

scikit-learn is not a dependency of pipe: install it where this script can import it (a
``pip install --target DIR scikit-learn cleanlab`` and PYTHONPATH=DIR is enough).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
PAIRS = [(1, 7), (3, 8), (4, 9), (5, 6), (0, 2)]
NAMES = [f"digit{d}" for d in range(10)]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        sys.exit("bench/label_noise.py needs scikit-learn (its digits data set): pip install --target DIR "
                 "scikit-learn and run with PYTHONPATH=DIR")
    d = sk_load()
    return d.images, d.target.astype(int)


def flip(labels: np.ndarray, share: float, mode: str, seed: int) -> np.ndarray:
    """The given labels: ``share`` of them changed, uniformly to another class or to the pair's other digit."""
    rng = np.random.default_rng(seed)
    given = labels.copy()
    if share <= 0:
        return given
    if mode == "uniform":
        chosen = rng.choice(len(labels), size=int(round(share * len(labels))), replace=False)
        for i in chosen:
            given[i] = (labels[i] + 1 + rng.integers(9)) % 10
        return given
    partner = {a: b for a, b in PAIRS} | {b: a for a, b in PAIRS}
    candidates = np.flatnonzero(np.isin(labels, list(partner)))
    chosen = rng.choice(candidates, size=int(round(share * len(labels))), replace=False)
    for i in chosen:
        given[i] = partner[int(labels[i])]
    return given


def write_raw(root: Path, images: np.ndarray, given: np.ndarray) -> None:
    for i, (img, label) in enumerate(zip(images, given)):
        pixels = (img * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
        big = Image.fromarray(pixels, "L").resize((32, 32), Image.BICUBIC).convert("RGB")
        folder = root / NAMES[label]
        folder.mkdir(parents=True, exist_ok=True)
        big.save(folder / f"d{i:04d}.png")


def pipe(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    if p.returncode != 0:
        sys.exit(f"pipe {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def index_of(source: str) -> int:
    return int(Path(source).stem[1:])


def cleanlab_on_val(run_dir: Path, flipped: set[int], sources: dict[str, str]) -> dict | None:
    """cleanlab's find_label_issues on the val predictions pipe train recorded (None without cleanlab)."""
    try:
        from cleanlab.filter import find_label_issues
    except ImportError:
        return None
    sys.path.insert(0, str(REPO))
    from train import labels as ours

    val = ours.load_val(run_dir)
    mask = find_label_issues(val.label, val.probs)
    theirs = {index_of(sources[k]) for k, m in zip(val.keys, mask) if m}
    q = ours.calibrated_joint(ours.confident_joint(val.probs, val.label), val.label)
    mine = {index_of(sources[val.keys[i]]) for i in ours.prune_by_noise_rate(val.probs, val.label, q)}
    in_val = {index_of(sources[k]) for k in val.keys} & flipped
    return {"val_flips": len(in_val), "cleanlab": _score(theirs, in_val), "ours": _score(mine, in_val),
            "agreement": len(theirs & mine) / max(1, len(theirs | mine))}


def _score(flagged: set[int], flipped: set[int]) -> dict:
    hit = len(flagged & flipped)
    return {"flagged": len(flagged), "precision": hit / len(flagged) if flagged else None,
            "recall": hit / len(flipped) if flipped else None}


def key_sources(shard_dir: Path) -> dict[str, str]:
    """key -> source of every sample (a scan of the shards' .json members)."""
    sys.path.insert(0, str(REPO))
    from train import labels as ours

    index = json.loads((shard_dir / "index.json").read_text())
    keys = set()
    from pipeline.formats.sample import split_name

    for shard in index["shards"]:
        with open(shard_dir / shard["name"], "rb") as f:
            for at in shard["offsets"]:
                f.seek(at)
                keys.add(split_name(f.read(100).split(b"\0", 1)[0].decode())[0])
    return ours.sources(shard_dir, index, keys)


def condition(work: Path, images, labels, share: float, mode: str, args) -> dict:
    given = flip(labels, share, mode, args.seed)
    flipped = set(np.flatnonzero(given != labels).tolist())
    raw, clean, shards, run = work / "raw", work / "clean", work / "shards", work / "run"
    write_raw(raw, images, given)
    t0 = time.monotonic()
    pipe("clean", str(raw), "-o", str(clean), "--size", "32", "--no-near-dedup", "--workers", "1")
    split = ["--val-fraction", str(args.val_fraction)] if args.val_fraction is not None else []  # None: pipe shard's default
    pipe("shard", str(clean), "-o", str(shards), "--seed", str(args.seed), "--workers", "1", *split)
    pipe("train", str(shards), "-o", str(run), "--model", "image", "--width", str(args.width), "--resolution", "32",
         "--epochs", str(args.epochs), "--batch-size", "32", "--lr", "3e-3", "--workers", "1", "--log-every", "1000",
         "--checkpoint-every", "0", "--seed", str(args.seed))
    t_train = time.monotonic() - t0
    printed = pipe("labels", str(run))
    issues = __import__("pyarrow.parquet", fromlist=["x"]).read_table(run / "label_issues.parquet").to_pylist()
    summary = json.loads((run / "label_issues.json").read_text())
    flagged = {index_of(r["source"]) for r in issues}
    sources = key_sources(shards)
    kept = {index_of(s) for s in sources.values()}  # what clean kept (exact duplicates merged)
    flipped &= kept
    out = {"noise": share, "mode": mode, "samples": len(kept), "flipped": len(flipped), "flagged": len(flagged),
           "estimated_rate": summary["estimated_noise_rate"], "train_accuracy": summary["last_epoch_train_accuracy"],
           "seconds_clean_shard_train": round(t_train, 1), "warnings": summary["warnings"], "pairs": summary["pairs"][:3],
           **{k: v for k, v in _score(flagged, flipped).items() if k != "flagged"},
           "flagged_share": len(flagged) / len(kept)}
    out["cleanlab_val"] = cleanlab_on_val(run, flipped, sources)
    if args.verbose:
        print(printed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--noise", type=float, action="append", help="one uniform share to flip (repeatable); default: all conditions")
    ap.add_argument("--pairs", action="store_true", help="with --noise: flip between confusable pairs instead")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-fraction", type=float, default=None,
                    help="pipe shard's (default: pipe shard's own default)")
    ap.add_argument("--keep", type=Path, help="keep each condition's folders under this folder (default: a temporary one)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    conditions = [(s, "pairs" if args.pairs else "uniform") for s in args.noise] if args.noise else \
        [(0.0, "uniform"), (0.05, "uniform"), (0.1, "uniform"), (0.1, "pairs")]
    images, labels = load_digits()
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for share, mode in conditions:
        if args.keep:
            work = args.keep / f"{mode}-{share:g}-val{args.val_fraction if args.val_fraction is not None else 'default'}"
            work.mkdir(parents=True, exist_ok=False)
            r = condition(work, images, labels, share, mode, args)
        else:
            with tempfile.TemporaryDirectory(prefix="pipe-label-noise-") as tmp:
                r = condition(Path(tmp), images, labels, share, mode, args)
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(f"\n{'condition':<16} {'flipped':>7} {'flagged':>7} {'est.rate':>8} {'precision':>9} {'recall':>7} "
          f"{'flagged%':>8} {'CL val P/R (ours)':>18} {'cleanlab val P/R':>17}")
    for r in results:
        cl = r["cleanlab_val"]
        print(f"{r['mode'] + ' ' + format(r['noise'], '.0%'):<16} {r['flipped']:>7} {r['flagged']:>7} "
              f"{r['estimated_rate']:>8.3f} {r['precision'] if r['precision'] is not None else float('nan'):>9.2f} "
              f"{r['recall'] if r['recall'] is not None else float('nan'):>7.2f} {r['flagged_share']:>8.1%} "
              f"{fmt(cl['ours']) if cl else '-':>18} {fmt(cl['cleanlab']) if cl else '-':>17}")


def fmt(s: dict | None) -> str:
    """A precision/recall pair as 0.93/0.81 ("-" when there is none, nan for an undefined one)."""
    if s is None:
        return "-"
    return (f"{s['precision'] if s['precision'] is not None else float('nan'):.2f}/"
            f"{s['recall'] if s['recall'] is not None else float('nan'):.2f}")


if __name__ == "__main__":
    main()
