"""Text decoding: ours (strict UTF-8 fast path; for legacy files a quick chardet pass over the
modern-web encodings on a 4 KB window, verified by a strict decode of the whole file, the full
detection only when that is unsure) against the naive way (chardet.detect on every whole file,
then decode), same corpus, one run.

The corpus: 80% UTF-8 and 20% legacy encodings (GBK, Big5, Shift_JIS, EUC-KR, KOI8-R, cp1251,
cp1252, ...; one in ten of those UTF-16 as Windows exports it, with or without a BOM), 2-50 KB
per file, prose in 15 languages. Each way runs as a whole process over all files (interpreter,
imports and chardet's models included), several rounds taking turns, best round kept; it is
scored on throughput and on accuracy: a file counts as right only when the decoded text equals
the original exactly. Start-up is measured too (a process decoding one UTF-8 and one legacy
file), so the per-file cost, which is what a long `pipe clean` run pays, is printed apart from
the fixed one; CPU time beside wall time, as it is less swayed by other users of the machine.
Hashing the answers to check them is left out of both. Then accuracy on short texts (every sentence and clause of tests/text_samples in
each legacy encoding), where detection is hardest.

    python bench/clean_text.py            # 2000 files, 3 rounds
    python bench/clean_text.py --quick    # 300 files, 1 round: a smoke run (start-up dominates)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WAYS = {"naive": "naive: chardet.detect(whole file)", "ours": "ours: decode_bytes",
        "ours-full": "ours: clean_text (whole stage)"}


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
        from naive import chardet_decode

        for name in names:
            data = (folder / name).read_bytes()
            nbytes += len(data)
            out[name] = chardet_decode(data)[0]
    elif way == "ours":  # the same work as the naive way: bytes -> str
        from pipeline.media.text.encodings import decode_bytes

        for name in names:
            data = (folder / name).read_bytes()
            nbytes += len(data)
            out[name] = decode_bytes(data).text
    else:  # the whole text stage: decode, mojibake check, normalise, hashes, MinHash
        from pipeline.media.text.clean import clean_text

        for name in names:
            data = (folder / name).read_bytes()
            nbytes += len(data)
            out[name] = clean_text(data).text
    t1, c1 = time.perf_counter(), time.process_time()
    # checking the answers is the bench's work, not the way's: timed apart and left out below
    digests = {k: hashlib.sha256(v.encode("utf-8")).hexdigest() if v is not None else None for k, v in out.items()}
    print(json.dumps({"way": way, "seconds": t1 - t0, "bytes": nbytes, "digests": digests,
                      "verify_wall": time.perf_counter() - t1, "verify_cpu": time.process_time() - c1}))


def run_way(way: str, folder: Path) -> dict:
    """One whole process: interpreter start, imports, chardet's models, every file."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", way, str(folder)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall"] = wall - res["verify_wall"]
    res["cpu"] = _children_cpu() - cpu0 - res["verify_cpu"]  # less swayed by other users' load than wall time
    return res


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def best_of(rounds: int, folder: Path) -> dict[str, dict]:
    """Each way ``rounds`` times, taking turns so that load hits all alike; the fastest round
    (wall and CPU time each at their best)."""
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for way in WAYS:
            r = run_way(way, folder)
            if way not in best:
                best[way] = r
            best[way]["wall"] = min(best[way]["wall"], r["wall"])
            best[way]["cpu"] = min(best[way]["cpu"], r["cpu"])
    return best


def short_text_accuracy() -> tuple[int, dict[str, int]]:
    """Every paragraph, sentence and clause (12+ characters) of the test samples in each legacy
    encoding that holds it: how many each way decodes to exactly the original."""
    from naive import chardet_decode

    from pipeline.media.text.encodings import decode_bytes
    from tests.text_samples import CONFUSABLE, LANGUAGES

    cases = []
    for samples in (LANGUAGES, CONFUSABLE):
        for encs, para in samples.values():
            sentences = [s.strip() for s in re.split(r"(?<=[.!?。])\s*", para) if s.strip()]
            clauses = [c.strip() for s in sentences for c in re.split(r"[,，、:;]", s) if len(c.strip()) >= 12]
            for unit in dict.fromkeys([para, *sentences, *clauses]):
                for enc in encs:
                    try:
                        data = unit.encode(enc)
                    except UnicodeEncodeError:
                        continue
                    if not data.isascii():
                        cases.append((unit, data))

    def naive(data: bytes) -> str | None:
        return chardet_decode(data)[0]

    right = {"naive": sum(naive(d) == u for u, d in cases), "ours": sum(decode_bytes(d).text == u for u, d in cases)}
    return len(cases), right


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 files, 1 round")
    ap.add_argument("--files", type=int, default=None, help="corpus size (default 2000)")
    ap.add_argument("--rounds", type=int, default=None, help="runs of each way, best kept (default 3)")
    ap.add_argument("--worker", nargs=2, metavar=("WAY", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return
    n = args.files or (300 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as d:
        folder, tiny = Path(d) / "corpus", Path(d) / "startup"
        folder.mkdir()
        tiny.mkdir()
        truth = build_corpus(folder, n)
        mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        legacy = sum(1 for k in truth if not k.endswith("utf-8.txt"))
        print(f"corpus: {n} files, {mb:.1f} MB, {legacy} legacy-encoded ({legacy / n:.0%}), 2-50 KB each")
        # start-up: one UTF-8 and one single-byte legacy file, so that both ways load chardet's models
        for name in (min(k for k in truth if k.endswith("utf-8.txt")), min(k for k in truth if k.endswith("cp1252.txt"))):
            shutil.copy(folder / name, tiny / name)
        startup = best_of(rounds, tiny)
        results = best_of(rounds, folder)
    print(f"{'way':<34}{'start-up s':>11}{'process s':>10}{'CPU s':>7}{'per file ms':>12}{'MB/s':>7}{'files/s':>8}"
          f"{'accuracy':>9}{'legacy':>8}")
    per_file, per_file_cpu = {}, {}
    for way, r in results.items():
        right = [k for k, v in r["digests"].items() if v == truth[k]]
        leg = [k for k in right if not k.endswith("utf-8.txt")]
        per_file[way] = max(r["wall"] - startup[way]["wall"], 1e-9) / n
        per_file_cpu[way] = max(r["cpu"] - startup[way]["cpu"], 1e-9) / n
        print(f"{WAYS[way]:<34}{startup[way]['wall']:>11.2f}{r['wall']:>10.2f}{r['cpu']:>7.2f}{1000 * per_file[way]:>12.2f}"
              f"{mb / r['wall']:>7.1f}{n / r['wall']:>8.0f}{len(right) / n:>9.1%}{len(leg) / max(1, legacy):>8.1%}")
    naive, ours, full = (results[w] for w in WAYS)
    print(f"throughput ratio ours/naive, whole processes of {n} files, best of {rounds}: "
          f"{naive['wall'] / ours['wall']:.1f}x decode, {naive['wall'] / full['wall']:.1f}x whole text stage "
          f"(CPU time: {naive['cpu'] / ours['cpu']:.1f}x, {naive['cpu'] / full['cpu']:.1f}x)")
    print(f"per-file ratio, start-up left out (what a long run approaches): "
          f"{per_file['naive'] / per_file['ours']:.1f}x decode, {per_file['naive'] / per_file['ours-full']:.1f}x whole stage "
          f"(CPU time: {per_file_cpu['naive'] / per_file_cpu['ours']:.1f}x, "
          f"{per_file_cpu['naive'] / per_file_cpu['ours-full']:.1f}x)")
    share = startup["ours"]["wall"] / ours["wall"]
    print(f"start-up (a process decoding one UTF-8 and one legacy file) is {share:.0%} of our decode process here"
          + ("; too few files to compare per-file costs, use 2000 or more" if share > 0.3 else ""))
    total, right = short_text_accuracy()
    print(f"short texts (sentences and clauses of tests/text_samples, in each legacy encoding): "
          f"ours {right['ours']}/{total} right, naive {right['naive']}/{total}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
