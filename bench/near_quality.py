"""Near-duplicate quality through `pipe clean` itself, with the default thresholds:

* found: each picture (coloured 1/f noise like a photo, and the test factory's smooth noise,
  landscape and portrait) next to five edited copies (JPEG quality 40, scaled to 60%, cropped
  2% centred and from one corner, brightened 8%); a copy counts as found when it ends
  ``near_duplicate`` of its own original, and any duplicate_of pointing at another picture counts
  as a false merge;
* false merges: sets of distinct pictures that merely look alike (MNIST-like digits of mixed
  and of one class, flat-shape icons, flat colours, gradients): the share that ends
  ``near_duplicate``.

    python bench/near_quality.py            # 40 pictures, 300 look-alikes per set
    python bench/near_quality.py --quick    # 10 pictures, 100 per set
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _clean(src: Path, out: Path) -> tuple[list[dict], dict]:
    import pyarrow.parquet as pq

    from pipeline.clean import stage as clean
    from pipeline.clean.stage import CleanConfig

    report = clean.run(CleanConfig(src, out, workers=0), show_progress=False)
    return pq.read_table(out / "manifest.parquet").to_pylist(), report


def found_rate(pictures: int) -> None:
    from PIL import Image

    from tests.factories import noise_rgb, write
    from tests.image_samples import EDITS, encode, natural

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "raw"
        for i in range(pictures):
            w, h = (640, 480) if i % 2 else (400, 600)
            for kind, im in (("nat", natural(100 + i, w, h)), ("noise", Image.fromarray(noise_rgb(w, h, seed=100 + i)))):
                write(src / f"{kind}{i:03d}" / "a_original.jpg", encode(im, quality=92))
                for name, edit in EDITS.items():
                    write(src / f"{kind}{i:03d}" / f"{name}.jpg", encode(edit(im), quality=92))
        rows, report = _clean(src, Path(d) / "clean")
    found: dict[str, list[bool]] = {}
    wrong = 0
    for r in rows:
        folder, name = r["source"].split("/")
        if name == "a_original.jpg":
            continue
        found.setdefault(name[:-4], []).append(r["reason"] == "near_duplicate" and r["duplicate_of"] == f"{folder}/a_original.jpg")
        wrong += bool(r["duplicate_of"]) and not r["duplicate_of"].startswith(folder + "/")
    print(f"edited copies found ({2 * pictures} pictures, half portrait):")
    for name, hits in found.items():
        print(f"  {name:<20}{sum(hits):>5}/{len(hits)}")
    print(f"  merged with another picture: {wrong}; search: {report['near_duplicate_search']}")


def false_merges(per_set: int) -> None:
    import numpy as np

    from tests.factories import write
    from tests.image_samples import LOOKALIKES, encode

    print(f"distinct look-alikes merged ({per_set} per set):")
    for kind in sorted(LOOKALIKES):
        rng = np.random.default_rng(123)
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "raw"
            for i in range(per_set):
                write(src / f"{i:04d}.png", encode(LOOKALIKES[kind](rng, i), "PNG"))
            rows, report = _clean(src, Path(d) / "clean")
        merged = sum(r["reason"] == "near_duplicate" for r in rows)
        s = report["near_duplicate_search"]
        print(f"  {kind:<12}{merged:>4} ({merged / per_set:.1%})   candidates checked on pixels: {s.get('candidates', 0)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    found_rate(10 if args.quick else 40)
    false_merges(100 if args.quick else 300)


if __name__ == "__main__":
    main()
