"""Text decoding: ours (strict UTF-8 fast path, chardet on a window, strict whole-file check)
against the naive way (chardet.detect on every whole file, then decode), same corpus, one run.

The corpus: 80% UTF-8 and 20% legacy encodings (GBK, Big5, Shift_JIS, EUC-KR, KOI8-R, cp1251,
cp1252, ...; one in ten of those UTF-16 as Windows exports it, with or without a BOM), 2-50 KB
per file, prose in 15 languages. Each way runs as a whole process over
all files (imports and model loading included), and is scored on throughput and on accuracy:
a file counts as right only when the decoded text equals the original exactly.

    python bench/clean_text.py            # 2000 files
    python bench/clean_text.py --quick    # 300 files, a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_corpus(folder: Path, n: int, seed: int = 0) -> dict[str, str]:
    """Write ``n`` files; return name -> sha256 of the UTF-8 of the true text."""
    from tests.text_samples import LANGUAGES

    rng = random.Random(seed)
    langs = sorted(LANGUAGES)
    truth = {}
    for i in range(n):
        lang = rng.choice(langs)
        encs, para = LANGUAGES[lang]
        legacy = rng.random() < 0.2
        enc = rng.choice(encs) if legacy else "utf-8"
        if legacy and rng.random() < 0.1:  # Windows "Unicode text" exports: UTF-16, half without a BOM
            enc = rng.choice(["utf-16", "utf-16-le"])
        size = rng.randint(2_000, 50_000)
        sentences = [s for s in para.replace("。", "。|").replace(". ", ". |").split("|") if s]
        parts, length = [], 0
        while length < size:
            s = rng.choice(sentences)
            parts.append(s + ("\n" if rng.random() < 0.1 else ""))
            length += len(s.encode(enc))
        text = "".join(parts)
        name = f"{i:05d}-{lang}-{enc}.txt"
        (folder / name).write_bytes(text.encode(enc))
        truth[name] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return truth


def worker(way: str, folder: Path) -> None:
    """Decode every file of ``folder`` one way; print a JSON line of results."""
    t0 = time.perf_counter()
    names = sorted(p for p in os.listdir(folder) if p.endswith(".txt"))
    out, nbytes = {}, 0
    if way == "naive":
        import chardet

        for name in names:
            data = (folder / name).read_bytes()
            nbytes += len(data)
            enc = chardet.detect(data)["encoding"]
            try:
                text = data.decode(enc) if enc else None
            except (UnicodeDecodeError, LookupError):
                text = None
            out[name] = text
    else:
        from pipeline.encodings import decode_bytes
        from pipeline.text import clean_text

        full = way == "ours-full"
        for name in names:
            data = (folder / name).read_bytes()
            nbytes += len(data)
            if full:  # the whole text stage: decode, mojibake check, normalise, hashes, MinHash
                out[name] = clean_text(data).text
            else:
                out[name] = decode_bytes(data).text
    digests = {k: hashlib.sha256(v.encode("utf-8")).hexdigest() if v is not None else None for k, v in out.items()}
    print(json.dumps({"way": way, "seconds": time.perf_counter() - t0, "bytes": nbytes, "digests": digests}))


def run_way(way: str, folder: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", way, str(folder)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall"] = time.perf_counter() - t0  # the whole process: start-up, imports, every file
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 files instead of 2000")
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--worker", nargs=2, metavar=("WAY", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return
    n = args.files or (300 if args.quick else 2000)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        truth = build_corpus(folder, n)
        mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        legacy = sum(1 for k in truth if not k.endswith("utf-8.txt"))
        print(f"corpus: {n} files, {mb:.1f} MB, {legacy} legacy-encoded ({legacy / n:.0%}), 2-50 KB each")
        results = {way: run_way(way, folder) for way in ("naive", "ours", "ours-full")}
    print(f"{'way':<34}{'process s':>10}{'MB/s':>9}{'files/s':>9}{'accuracy':>10}{'legacy acc':>11}")
    labels = {"naive": "naive: chardet.detect(whole file)", "ours": "ours: decode_bytes",
              "ours-full": "ours: clean_text (whole stage)"}
    for way, r in results.items():
        right = [k for k, v in r["digests"].items() if v == truth[k]]
        leg = [k for k in right if not k.endswith("utf-8.txt")]
        print(f"{labels[way]:<34}{r['wall']:>10.2f}{mb / r['wall']:>9.1f}{n / r['wall']:>9.0f}"
              f"{len(right) / n:>10.1%}{len(leg) / max(1, legacy):>11.1%}")
    naive, ours = results["naive"]["wall"], results["ours"]["wall"]
    print(f"throughput ratio ours/naive: {naive / ours:.1f}x (decode only), "
          f"{naive / results['ours-full']['wall']:.1f}x (whole text stage)")


if __name__ == "__main__":
    main()
