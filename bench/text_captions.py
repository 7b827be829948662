"""Decoding short captions (class names, prompts, tags) in legacy code pages, the way datasets hold
them: a folder of captions from one source, in one language and (mostly) one encoding.

The captions are real translations from the machine's gettext catalogs (as bench/text_accuracy.py
takes them), 90% of them at most 300 bytes, encoded in the code pages their language was written
in, plus UTF-16-LE and -BE without a byte-order mark. Each (language, encoding) is a folder of
``--per-folder`` captions; with ``--mixed`` (the default) every folder also holds two captions in
another code page of its language, as real folders mix encodings.

Three ways run on every file in the same run:

* chardet: `chardet.detect` on the whole file, then a strict decode with its answer (the naive way);
* pipe: `pipeline.media.text.clean.clean_text` per file, as `pipe clean` reads one file;
* pipe + folder: the same readings, then the folder prior (`pipeline.media.text.prior`) over each
  folder's files;
* pipe clean: the folders written to a temporary INPUT and cleaned by `pipe clean` (one label,
  --no-near-dedup: an exact copy is read as its kept copy), each file's reading taken from its
  output and the manifest's encoding (`--no-clean`: not run).

The prior's cost in `pipe clean` (`--cost-rounds`, 0: not measured): the same folders cleaned by
`python -m pipeline clean RAW -o OUT --no-near-dedup`, as a user runs it, with the folder prior and
without it (the bench stubs out the step, `stage._folder_prior`, which no option turns off),
rounds interleaved; CPU is user+sys of the whole process tree (the workers included), and the
step's own CPU on the driver is timed around `pipeline.clean.prior.apply`.

Each file is right (exactly the true text after pipe's normalisation), a variant (a superset's
reading differing in a few symbols: cp932 for Shift_JIS, ...), refused (no text: honest), or
WRONG (other text, silently: the failure that costs days).

    python bench/text_captions.py [--seed 0] [--per-folder 12] [--list] [--no-clean] [--cost-rounds 2]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from text_accuracy import LEGACY, messages  # noqa: E402
from text_packages import verdict  # noqa: E402

# Languages whose captions also come in UTF-16 without a byte-order mark (Windows "Unicode" exports).
WIDE = ("de", "fr", "ru", "el", "ar", "he", "tr", "ja", "zh_CN", "ko", "th", "vi")
# Share of a folder's captions longer than this many bytes (the rest are at most this long).
SHORT_BYTES = 300
LONG_SHARE = 0.1


def fits(msgs: list[str], enc: str) -> list[tuple[str, bytes]]:
    """(caption, bytes) for each message the encoding holds and writes beyond ASCII."""
    out = []
    for m in msgs:
        try:
            data = m.encode(enc)
        except UnicodeEncodeError:
            continue
        if not data.isascii():
            out.append((m, data))
    return out


def folders(catalogs: Path, seed: int, per_folder: int, mixed: bool) -> dict[str, list[tuple[str, str, bytes]]]:
    """folder name -> [(true encoding, true text, bytes)]."""
    rng = random.Random(seed)
    out: dict[str, list[tuple[str, str, bytes]]] = {}
    langs = dict(LEGACY)
    langs["vi"] = ("cp1258",)
    for lang, encodings in langs.items():
        msgs = messages(catalogs, lang)
        if not msgs:
            continue
        encs = list(encodings) + (["utf-16-le", "utf-16-be"] if lang in WIDE else [])
        pools = {enc: fits(msgs, enc) for enc in encs}
        for enc in encs:
            pool = pools[enc]
            if len(pool) < per_folder:
                continue
            short = [p for p in pool if len(p[1]) <= SHORT_BYTES]
            long = [p for p in pool if len(p[1]) > SHORT_BYTES]
            n_long = min(len(long), round(per_folder * LONG_SHARE))
            chosen = rng.sample(short, min(len(short), per_folder - n_long)) + rng.sample(long, n_long)
            files = [(enc, m, data) for m, data in chosen]
            others = [e for e in encodings if e != enc and len(pools[e]) >= 2 and not enc.startswith("utf-16")]
            if mixed and others:
                other = rng.choice(others)
                files += [(other, m, data) for m, data in rng.sample(pools[other], 2)]
            out[f"{lang}/{enc}"] = files
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalogs", type=Path, default=Path("/usr/share/locale"), help="a gettext locale folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-folder", type=int, default=12)
    ap.add_argument("--single", action="store_true", help="every folder in one encoding (no intruders)")
    ap.add_argument("--list", action="store_true", help="print every file a way got wrong")
    ap.add_argument("--no-clean", action="store_true", help="leave out the run through pipe clean")
    ap.add_argument("--cost-rounds", type=int, default=2, help="pipe clean runs with and without the prior, each "
                                                               "(0: leave the cost out)")
    args = ap.parse_args()
    from naive import chardet_decode

    from pipeline.media.text.clean import TextSettings, clean_text
    from pipeline.media.text.prior import FolderFile, by_folder

    tree = folders(args.catalogs, args.seed, args.per_folder, not args.single)
    if not tree:
        sys.exit(f"no gettext catalogs with legacy-encodable translations under {args.catalogs}")
    ways = ("chardet", "pipe", "pipe + folder") + (() if args.no_clean else ("pipe clean",))
    score: dict[str, Counter[str]] = {w: Counter() for w in ways}
    cleaned = {} if args.no_clean else through_clean(tree)
    listed: list[str] = []
    decided = 0
    sizes = [len(data) for files in tree.values() for _e, _t, data in files]
    for name, files in tree.items():
        per_file = []
        for enc, text, data in files:
            got, got_enc = chardet_decode(data)
            v = verdict(text, got, enc, got_enc)
            score["chardet"][v] += 1
            if args.list and v in ("WRONG", "refused"):
                listed.append(f"chardet {v:8}{name:22}{enc:12}as {got_enc} ({len(data)} B)")
                listed.append(f"{'':8}true {text[:60]!r} read {(got or '')[:60]!r}")
            o = clean_text(data, TextSettings())
            per_file.append(FolderFile(data, o.text if o.reason is None else None, o.encoding, o.confidence))
        chosen = by_folder(per_file)
        for i, ((enc, text, data), f, c) in enumerate(zip(files, per_file, chosen, strict=True)):
            readings = [("pipe", (f.text, f.encoding)), ("pipe + folder", (c.text, c.encoding))]
            if cleaned:
                readings.append(("pipe clean", cleaned[_rel(name, i)]))
            for way, (t, e) in readings:
                v = verdict(text, t, enc, e)
                score[way][v] += 1
                if args.list and v in ("WRONG", "refused"):
                    why = (f"the prior's: {c.note}" if way != "pipe" and c.by_prior
                           else f"its own, {f.encoding} at confidence {f.confidence}")
                    listed.append(f"{way:14}{v:8}{name:22}{enc:12}as {e} ({len(data)} B): {why}")
                    listed.append(f"{'':14}true {text[:60]!r} read {(t or '')[:60]!r}")
            decided += c.by_prior
    n = len(sizes)
    short = sum(1 for s in sizes if s <= SHORT_BYTES)
    print(f"{n} captions in {len(tree)} folders ({len({k.split('/')[0] for k in tree})} languages, seed {args.seed}, "
          f"{'one encoding a folder' if args.single else 'two intruders a folder'}), "
          f"{short / n:.0%} at most {SHORT_BYTES} bytes, median {sorted(sizes)[n // 2]} B")
    print(f"{'':16}{'right':>8}{'variant':>9}{'refused':>9}{'WRONG':>8}{'right+variant':>15}{'WRONG':>8}")
    for way, s in score.items():
        ok = s["right"] + s["variant"]
        print(f"{way:16}{s['right']:>8}{s['variant']:>9}{s['refused']:>9}{s['WRONG']:>8}"
              f"{ok / n:>14.1%}{s['WRONG'] / n:>8.1%}")
    print(f"the folder prior decided {decided} files" + (f" ({cleaned_by_prior[0]} in pipe clean)" if cleaned else ""))
    if args.cost_rounds and not args.no_clean:
        print(cost(tree, args.cost_rounds))
    for line in listed:
        print(line)


cleaned_by_prior = [0]

# `python -m pipeline clean` with the folder prior stubbed out ("without") or timed ("with"): the
# step's CPU on the driver goes to the file named last
_DRIVER = """
import sys, time
import pipeline.clean.prior as prior
import pipeline.clean.stage as stage
way, spent_file = sys.argv[1], sys.argv[-1]
spent = [0.0]
if way == "without":
    stage._folder_prior = lambda *a, **k: {}
else:
    apply = prior.apply
    def timed(*a, **k):
        t = time.process_time()
        try:
            return apply(*a, **k)
        finally:
            spent[0] += time.process_time() - t
    prior.apply = timed
import atexit
atexit.register(lambda: open(spent_file, "w").write(str(spent[0])))
sys.argv = ["pipe", "clean", *sys.argv[2:-1]]
from pipeline.cli.app import main
main()
"""


def cost(tree: dict[str, list[tuple[str, str, bytes]]], rounds: int) -> str:
    """CPU of `pipe clean` on the folders with the prior and without it, rounds interleaved, and the
    prior step's own CPU: the line the bench prints."""
    import os
    import resource
    import statistics
    import subprocess
    import tempfile

    def children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    with tempfile.TemporaryDirectory(prefix="captions-cost-") as tmp:
        raw = Path(tmp) / "raw"
        _write_tree(tree, raw)
        cpu: dict[str, list[float]] = {"with": [], "without": []}
        step: list[float] = []
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for _ in range(rounds):
            for way in ("with", "without"):
                out, spent = Path(tmp) / f"clean-{way}", Path(tmp) / "spent"
                subprocess.run(["rm", "-rf", str(out)], check=True)
                before = children_cpu()
                subprocess.run([sys.executable, "-c", _DRIVER, way, str(raw), "-o", str(out), "--no-near-dedup",
                                str(spent)],
                               check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                cpu[way].append(children_cpu() - before)
                if way == "with":
                    step.append(float(spent.read_text()))
    n = sum(len(files) for files in tree.values())
    w, wo, s = statistics.median(cpu["with"]), statistics.median(cpu["without"]), statistics.median(step)
    load = os.getloadavg()[0]
    return (f"pipe clean on the {n} captions ({len(tree)} folders), CPU of the process tree, median of {rounds} "
            f"interleaved rounds: with the prior {w:.2f} s, without {wo:.2f} s ({w / wo:.2f}x); the prior step "
            f"itself {s * 1000:.0f} ms on the driver ({s / n * 1e6:.0f} us a caption); load {load:.1f}")


def _write_tree(tree: dict[str, list[tuple[str, str, bytes]]], raw: Path) -> None:
    for name, files in tree.items():
        for i, (_enc, _text, data) in enumerate(files):
            p = raw / _rel(name, i)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


def _rel(folder: str, i: int) -> str:
    return f"captions/{folder}/{i:03d}.txt"


def through_clean(tree: dict[str, list[tuple[str, str, bytes]]]) -> dict[str, tuple[str | None, str | None]]:
    """Each file's (text, encoding) as `pipe clean` leaves it: its kept output (or its exact copy's),
    None where it was quarantined."""
    import tempfile

    import pyarrow.parquet as pq

    from pipeline.clean import stage
    from pipeline.clean.stage import CleanConfig

    with tempfile.TemporaryDirectory(prefix="captions-") as tmp:
        raw, out = Path(tmp) / "raw", Path(tmp) / "clean"
        _write_tree(tree, raw)
        report = stage.run(CleanConfig(raw, out, near_dedup=False), show_progress=False)
        cleaned_by_prior[0] = report.get("folder_prior", {}).get("files", 0)
        rows = pq.read_table(out / "manifest.parquet").to_pylist()
        kept = {r["content_hash"]: (out / r["output"]).read_text(encoding="utf-8") for r in rows if r["status"] == "kept"}
        return {r["source"]: (kept.get(r["content_hash"]) if r["status"] != "quarantined" else None, r["encoding"])
                for r in rows}


if __name__ == "__main__":
    main()
