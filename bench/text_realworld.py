"""Decoding on files from another project's test suite: chardet 5.2.0's own test corpus
(426 real web pages and texts in ~50 encodings, the folder naming each file's true encoding),
fetched from PyPI as chardet's source distribution and cached in bench-out/.

For each file, ours (`pipeline.media.text.encodings.decode_bytes`) and the naive way (`chardet.detect` on
the whole file, then decode) are scored against the text the true encoding gives:

* right: exactly the true text (after the normalisation pipe applies: NFC, `\\n`, no controls);
* variant: a superset's mapping of a few symbols (cp932 for Shift_JIS, gb18030 for GB2312, ...);
* refused: not decoded (ours: a quarantine reason; naive: an exception) — honest, not silent;
* WRONG: decoded to other text without a word: the failure that costs days.

    python bench/text_realworld.py
"""

from __future__ import annotations

import codecs
import subprocess
import sys
import tarfile
import unicodedata
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CACHE = REPO / "bench-out" / "chardet-corpus"
SDIST = "chardet==5.2.0"
SUFFIXES = ("-croatian", "-czech", "-hungarian", "-polish", "-slovak", "-slovene", "-bulgarian", "-russian",
            "-arabic", "-greek", "-turkish", "-romanian")
VARIANTS = {("shift_jis", "cp932"), ("gb2312", "gb18030"), ("tis-620", "cp874"), ("euc_kr", "cp949"),
            ("big5", "big5hkscs"), ("cp866", "cp1125"), ("iso8859-1", "cp1252"), ("ascii", "utf-8")}


def corpus() -> Path:
    tests = next(CACHE.glob("chardet-*/tests"), None)
    if tests is None:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(CACHE)], check=True)
        with tarfile.open(next(CACHE.glob("chardet-*.tar.gz"))) as t:
            t.extractall(CACHE, filter="data")
        tests = next(CACHE.glob("chardet-*/tests"))
    return tests


def truth_codec(folder: str) -> str | None:
    for suffix in SUFFIXES:
        folder = folder.removesuffix(suffix)
    try:
        return codecs.lookup(folder).name
    except LookupError:
        return None


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFC", text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n"))
    return "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")


def verdict(truth: str, text: str | None, true_codec: str, codec: str | None) -> str:
    if text is None:
        return "refused"
    if normalise(text) == truth:
        return "right"
    names = (true_codec, codecs.lookup(codec).name if codec else "")
    if any((codecs.lookup(a).name, codecs.lookup(b).name) == names for a, b in VARIANTS):
        return "variant"
    return "WRONG"


def naive(data: bytes) -> tuple[str | None, str | None]:
    from naive import chardet_decode

    return chardet_decode(data)


def ours(data: bytes) -> tuple[str | None, str | None]:
    from pipeline.media.text.clean import TextSettings, clean_text
    from pipeline.media.text.encodings import decode_bytes

    d = decode_bytes(data)
    if d.text is None:
        return None, d.encoding
    o = clean_text(data, TextSettings())  # the whole text stage: garbled text is refused too
    return (d.text if o.reason is None else None), d.encoding


def main() -> None:
    root = corpus()
    score = {"naive": Counter(), "ours": Counter()}
    wrong = {"naive": [], "ours": []}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        codec = truth_codec(path.parent.name)
        if codec is None:
            continue
        data = path.read_bytes()
        try:
            truth = normalise(data.decode(codec))
        except UnicodeDecodeError:
            continue
        for name, fn in (("naive", naive), ("ours", ours)):
            text, enc = fn(data)
            v = verdict(truth, text, codec, enc)
            score[name][v] += 1
            if v == "WRONG":
                wrong[name].append(f"{path.relative_to(root)} as {enc}")
    n = sum(score["ours"].values())
    print(f"{n} files of {root.parent.name}'s test corpus, scored against the encoding their folder names")
    print(f"{'':8}{'right':>8}{'variant':>9}{'refused':>9}{'WRONG':>8}")
    for name in ("naive", "ours"):
        s = score[name]
        print(f"{name:8}{s['right']:>8}{s['variant']:>9}{s['refused']:>9}{s['WRONG']:>8}")
    for name in ("naive", "ours"):
        print(f"{name} decoded silently wrong: " + ("; ".join(wrong[name][:8]) or "none") + (" ..." if len(wrong[name]) > 8 else ""))


if __name__ == "__main__":
    main()
