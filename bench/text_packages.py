"""Decoding text nobody on the team wrote: real texts that ship in packages (Debian's fortune
databases and translated manual pages, the Korean corpus konlpy ships, CPython's CJK codec test
files), in the code pages each language was written in. Offline: the texts are in
bench/data/text_packages/ (README.md there says where from, under which licence, and how
extract.py made them).

Each text is stored in UTF-8 and encoded here in every code page of its language that can hold
it (Esperanto ISO-8859-3; Czech and Polish cp1250 and ISO-8859-2; Greek cp1253, ISO-8859-7 and
DOS cp737; Russian cp1251, KOI8-R, ISO-8859-5, MacCyrillic and DOS cp866; Ukrainian cp1251,
KOI8-U and MacCyrillic; ...; Chinese GB18030, HZ, Big5-HKSCS and cp950; Japanese Shift_JIS,
cp932 and EUC-JP; Korean cp949 and EUC-KR); CPython's CJK test files are taken as they ship,
in their own encodings. Two lengths: short (a fortune or a sentence or two of a manual page,
20-400 characters) and long (a manual page or a run of fortunes, 2-30 KB).

Both ways run on every file in the same run:

* pipe: `pipeline.media.text.clean.clean_text`, the real path (decode, then the garbled-text
  check, which may refuse); its text is scored;
* chardet: `chardet.detect` on the whole file, then a strict decode with its answer.

Each file is right (exactly the true text, after the normalisation pipe applies), a variant (a
superset's reading that differs in a few symbols: cp932 for Shift_JIS, ...), refused (no text:
honest), or WRONG (other text, silently). Then both ways are timed (decoding only:
`decode_bytes` against `chardet.detect` + decode, best of three rounds) on these legacy files
alone, and on a mixed corpus of them and four times as many UTF-8 files of the same texts (the
80/20 mix bench/clean_text.py uses). A short legacy file costs pipe a chardet pass over the
whole file (chardet's reading is the floor) and, when that reading is not clean, its own.

    python bench/text_packages.py            # the table, per family and length
    python bench/text_packages.py --list     # ... and every file either way got wrong
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
DATA = REPO / "bench" / "data" / "text_packages"
FAMILY = {"de": "Western", "es": "Western", "cs": "Central European", "pl": "Central European",
          "eo": "Esperanto", "el": "Greek", "ru": "Cyrillic", "uk": "Cyrillic", "bg": "Cyrillic",
          "tr": "Turkish", "zh_CN": "Chinese", "zh_TW": "Chinese", "ja": "Japanese", "ko": "Korean"}
# CPython's cjkencodings files: encoding -> family (the ISO-2022 ones are 7-bit and settled by
# their escapes; they are in for completeness)
CJK_FILES = {"big5": "Chinese", "big5hkscs": "Chinese", "gb2312": "Chinese", "gbk": "Chinese", "gb18030": "Chinese",
             "hz": "Chinese", "cp949": "Korean", "euc_kr": "Korean", "johab": "Korean", "iso2022_kr": "Korean",
             "euc_jp": "Japanese", "euc_jisx0213": "Japanese", "shift_jis": "Japanese",
             "shift_jisx0213": "Japanese", "iso2022_jp": "Japanese"}
VARIANTS = {("shift_jis", "cp932"), ("gb2312", "gb18030"), ("gbk", "gb18030"), ("euc_kr", "cp949"),
            ("big5", "big5hkscs"), ("big5", "cp950"), ("cp950", "big5hkscs"), ("iso8859-1", "cp1252"),
            ("euc_jis_2004", "euc_jp"), ("shift_jis_2004", "cp932"), ("shift_jisx0213", "cp932")}
VERDICTS = ("right", "variant", "refused", "WRONG")


def cases() -> list[tuple[str, str, str, str, bytes, str]]:
    """(family, length, language, encoding, bytes, true text) for each file."""
    out = []
    for f in sorted(DATA.glob("*.json")):
        rec = json.loads(f.read_text("utf-8"))
        lang = rec["language"]
        for length in ("short", "long"):
            for text in rec[length]:
                for enc in rec["encodings"]:
                    try:
                        data = text.encode(enc)
                    except UnicodeEncodeError:
                        continue  # cp737 has no curly quotes, MacCyrillic no "№"...: not a text of that code page
                    out.append((FAMILY[lang], length, lang, enc, data, text))
    for enc, family in CJK_FILES.items():
        data = (DATA / "cjkencodings" / f"{enc}.txt").read_bytes()
        text = (DATA / "cjkencodings" / f"{enc}-utf8.txt").read_text("utf-8")
        out.append((family, "short" if len(data) < 400 else "long", "cpython", enc, data, text))
    return out


def normalise(text: str) -> str:
    """pipe's own normalisation, for the true text and both ways' readings alike (a form feed is a
    line break there, not a control to drop)."""
    from pipeline.media.text.clean import normalize

    return normalize(text)[0]


def verdict(truth: str, text: str | None, true_enc: str, codec: str | None) -> str:
    if text is None:
        return "refused"
    if normalise(text) == normalise(truth):
        return "right"
    names = (codecs.lookup(true_enc).name, codecs.lookup(codec).name if codec else "")
    if any((codecs.lookup(a).name, codecs.lookup(b).name) == names for a, b in VARIANTS):
        return "variant"
    return "WRONG"


def pipe(data: bytes) -> tuple[str | None, str | None]:
    from pipeline.media.text.clean import TextSettings, clean_text

    o = clean_text(data, TextSettings())
    return (o.text if o.reason is None else None), o.encoding


def naive(data: bytes) -> tuple[str | None, str | None]:
    from naive import chardet_decode

    return chardet_decode(data)


def timed(files: list[bytes]) -> dict[str, float]:
    """Seconds to decode every file, best of three rounds, each way (decoding only)."""
    from naive import chardet_decode

    from pipeline.media.text.encodings import decode_bytes

    ways = {"pipe": decode_bytes, "chardet": chardet_decode}
    best = {name: float("inf") for name in ways}
    for _ in range(3):
        for name, way in ways.items():
            t0 = time.perf_counter()
            for data in files:
                way(data)
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="name every file either way got wrong or refused")
    ap.add_argument("--no-time", action="store_true", help="skip the timing")
    args = ap.parse_args()
    all_cases = cases()
    score: dict[tuple[str, str, str], Counter] = defaultdict(Counter)  # (way, family, length)
    misses = []
    for family, length, lang, enc, data, truth in all_cases:
        for name, way in (("pipe", pipe), ("chardet", naive)):
            text, got = way(data)
            v = verdict(truth, text, enc, got)
            score[name, family, length][v] += 1
            if v in ("WRONG", "refused"):
                misses.append(f"{name:8}{v:8}{family:18}{length:6}{lang:6}{enc:14}read as {got} ({len(data)} B)")
    print(f"{len(all_cases)} files from {DATA.relative_to(REPO)}: right / variant / refused / WRONG")
    print(f"{'family':18}{'length':7}{'files':>6}   {'pipe':^22}   {'chardet whole file':^22}")
    families = sorted({c[0] for c in all_cases})
    total = {"pipe": Counter(), "chardet": Counter()}
    for family in families:
        fam = {"pipe": Counter(), "chardet": Counter()}
        for length in ("short", "long"):
            s = {name: score[name, family, length] for name in ("pipe", "chardet")}
            n = sum(s["pipe"].values())
            if n:
                print(f"{family:18}{length:7}{n:>6}   " + "   ".join(_row(s[name]) for name in ("pipe", "chardet")))
            for name in fam:
                fam[name].update(s[name])
                total[name].update(s[name])
        n = sum(fam["pipe"].values())
        print(f"{family:18}{'all':7}{n:>6}   " + "   ".join(_row(fam[name]) for name in ("pipe", "chardet")))
    n = sum(total["pipe"].values())
    print(f"{'all':18}{'all':7}{n:>6}   " + "   ".join(_row(total[name]) for name in ("pipe", "chardet")))
    for name in ("pipe", "chardet"):
        t = total[name]
        print(f"{name}: right or variant {(t['right'] + t['variant']) / n:.1%}, silently wrong {t['WRONG'] / n:.1%}")
    if args.list:
        print("\n".join(sorted(misses)))
    if not args.no_time:
        legacy = [c[4] for c in all_cases]
        utf8 = [c[5].encode("utf-8") for c in all_cases] * 4
        for name, files in (("the legacy files", legacy), ("legacy + 4x as many UTF-8", legacy + utf8)):
            best = timed(files)
            print(f"decoding {name} ({len(files)} files), best of 3: pipe {best['pipe']:.2f} s, "
                  f"chardet {best['chardet']:.2f} s: pipe {best['chardet'] / best['pipe']:.1f}x chardet's speed")


def _row(c: Counter) -> str:
    return " ".join(f"{c[v]:>5}" for v in VERDICTS)


if __name__ == "__main__":
    main()
