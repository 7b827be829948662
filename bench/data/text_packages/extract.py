"""How bench/data/text_packages/*.json were made (run once; the bench reads only the JSON files).

Real text from packages nobody on the team wrote: Debian's fortune databases and translated
manual pages, the Korean corpus konlpy ships on PyPI, and CPython's CJK codec test files
(libpython3.11-testsuite). Each language's texts are stored here in UTF-8; the bench encodes
them into the code pages the language was written in. README.md beside this says where each
came from and under which licence.

    mkdir /tmp/debs && cd /tmp/debs && apt-get download fortunes-eo fortunes-cs fortunes-pl \
        fortunes-ru fortunes-zh fortunes-de fortunes-es fortunes-it fortunes-bg manpages-el \
        manpages-uk manpages-ja manpages-zh manpages-cs manpages-ru manpages-tr manpages-pl \
        libpython3.11-testsuite && for f in *.deb; do dpkg-deb -x $f x; done
    pip download --no-deps konlpy==0.6.0 -d /tmp/ko && cd /tmp/ko && unzip konlpy-*.whl 'konlpy/data/*'
    python bench/data/text_packages/extract.py /tmp/debs/x /tmp/ko
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHORTS, LONGS = 24, 4  # per language
SHORT_CHARS = (20, 400)
LONG_BYTES = (2_000, 30_000)
# language -> (where its short texts come from, where its documents come from)
SOURCES = {
    "eo": ("fortunes/eo", "fortunes/eo"),
    "cs": ("fortunes/cs", "man/cs"),
    "pl": ("fortunes/pl", "man/pl"),
    "de": ("fortunes/de", "fortunes/de"),
    "es": ("fortunes/es", "fortunes/es"),
    "el": ("man/el", "man/el"),
    "ru": ("fortunes/ru", "man/ru"),
    "uk": ("man/uk", "man/uk"),
    "bg": ("fortunes/bg", "fortunes/bg"),
    "tr": ("man/tr", "man/tr"),
    "zh_CN": ("fortunes/chinese", "man/zh_CN"),
    "zh_TW": ("man/zh_TW", "man/zh_TW"),
    "ja": ("man/ja", "man/ja"),
    "ko": ("konlpy", "konlpy"),
}
# what every text of the language must encode in (the bench's code pages for it)
ENCODINGS = {
    "eo": ("iso8859_3",), "cs": ("cp1250", "iso8859_2"), "pl": ("cp1250", "iso8859_2"),
    "de": ("cp1252", "iso8859_15"), "es": ("cp1252", "iso8859_15"),
    "el": ("cp1253", "iso8859_7", "cp737"),
    "ru": ("cp1251", "koi8_r", "iso8859_5", "mac_cyrillic", "cp866"), "uk": ("cp1251", "koi8_u", "mac_cyrillic"),
    "bg": ("cp1251",), "tr": ("cp1254", "iso8859_9"), "zh_CN": ("gb18030", "hz"), "zh_TW": ("big5hkscs", "cp950"),
    "ja": ("shift_jis", "cp932", "euc_jp"), "ko": ("cp949", "euc_kr"),
}
_ANSI = re.compile("\x1b\\[[0-9;]*m")
_TROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\f\(..|\\[&/,]|\\\*\(..|\\\*.")


def fortunes(folder: Path) -> list[str]:
    """Every fortune (entries between "%" lines) of the folder's UTF-8 databases."""
    files = [folder] if folder.is_file() else sorted(p for p in folder.iterdir()
                                                    if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
    out = []
    for f in files:
        try:
            text = f.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        out += [_ANSI.sub("", e).strip("\n") for e in re.split(r"\n%\n", text.replace("\r\n", "\n"))]
    return [e for e in out if e.strip() and "\x1b" not in e]


def man_pages(folder: Path) -> list[tuple[str, str]]:
    """(name, troff source) of every page, the "-*- coding: UTF-8 -*-" line dropped (it would lie
    once the text is in a legacy code page)."""
    out = []
    for f in sorted(folder.rglob("*.gz")):
        try:
            text = gzip.decompress(f.read_bytes()).decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append((f.name, "\n".join(line for line in text.split("\n") if "coding:" not in line)))
    return out


def man_sentences(pages: list[tuple[str, str]]) -> list[str]:
    """Running text of the pages: lines that are not requests or comments, escapes removed."""
    out = []
    for _name, text in pages:
        for line in text.split("\n"):
            if line.startswith((".", "'", '\\"')):
                continue
            out.append(_TROFF_ESCAPE.sub("", line).replace("\\-", "-").replace("\\e", "\\").strip())
    return [s for s in out if s]


def korean(root: Path) -> tuple[list[str], list[str]]:
    corpus = root / "konlpy" / "data" / "corpus"
    paras = []
    docs = []
    for f in sorted(corpus.rglob("*.txt")):
        # the bills' few punctuation marks beyond KS X 1001 (converted from a word processor), as
        # an EUC-KR-era file had them: middle dots and corner brackets
        text = f.read_text("utf-8").replace("\r\n", "\n").translate(_KS_PUNCTUATION)
        docs.append(text)
        paras += [p.strip() for p in text.split("\n") if p.strip()]
    return paras, docs


_KS_PUNCTUATION = str.maketrans({"\u2024": "·", "\u22c5": "·", "\u2027": "·", "\u2219": "·", "\uff65": "·",
                                 "\u2022": "·", "\uff62": "「", "\uff63": "」", "\u25e6": "○"})


def fits(text: str, lang: str) -> bool:
    """The language's main code page encodes it, with bytes beyond ASCII. (The bench leaves out a
    text that another of its code pages cannot encode: cp737 has no curly quotes.)"""
    try:
        return not text.encode(ENCODINGS[lang][0]).isascii()
    except UnicodeError:
        return False


def shorts_of(lang: str, pool: list[str], rng: random.Random) -> list[str]:
    lo, hi = SHORT_CHARS
    ok = sorted({t for t in pool if lo <= len(t) <= hi and fits(t, lang)})
    return rng.sample(ok, min(SHORTS, len(ok)))


def longs_of(lang: str, docs: list[str], rng: random.Random) -> list[str]:
    lo, hi = LONG_BYTES
    out = []
    for d in docs:
        if len(d.encode("utf-8")) > hi:
            d = d[: d.rfind("\n", 0, hi // 2)]  # a page's first part, cut at a line end
        if lo <= len(d.encode("utf-8")) and fits(d, lang):
            out.append(d)
    return rng.sample(out, min(LONGS, len(out)))


def chunks(entries: list[str], rng: random.Random) -> list[str]:
    """Documents made of consecutive fortunes of one database (as the file holds them)."""
    out, i = [], 0
    while i < len(entries):
        size, doc = rng.randint(*LONG_BYTES), []
        while i < len(entries) and sum(len(e) for e in doc) < size:
            doc.append(entries[i])
            i += 1
        out.append("\n%\n".join(doc))
    return out[:-1]  # the last one may be short


def main(debs: Path, konlpy: Path) -> None:
    share = debs / "usr" / "share"
    rng = random.Random(0)
    for lang, (short_src, long_src) in SOURCES.items():
        if lang == "ko":
            pool, docs = korean(konlpy)
        else:
            def load(src: str) -> tuple[list[str], list[str]]:
                kind, rel = src.split("/", 1)
                if kind == "fortunes":
                    f = fortunes(share / "games" / "fortunes" / rel)
                    return f, chunks(f, random.Random(1))
                pages = man_pages(share / "man" / rel)
                return man_sentences(pages), [t for _n, t in pages]
            pool, _ = load(short_src)
            _, docs = load(long_src)
        if lang in ("el", "uk", "tr", "zh_TW", "ja"):  # sentences from manual pages: one or two lines
            pool = [" ".join(pool[i : i + 1 + (i % 2)]) for i in range(len(pool))]
        record = {"language": lang, "short_from": short_src, "long_from": long_src, "encodings": ENCODINGS[lang],
                  "short": shorts_of(lang, pool, rng), "long": longs_of(lang, docs, rng)}
        (HERE / f"{lang}.json").write_text(json.dumps(record, ensure_ascii=False, indent=0) + "\n", "utf-8")
        print(lang, len(record["short"]), len(record["long"]), sum(len(t) for t in record["long"]))
    cjk = debs / "usr" / "lib" / "python3.11" / "test" / "cjkencodings"
    dest = HERE / "cjkencodings"
    dest.mkdir(exist_ok=True)
    for f in sorted(cjk.glob("*.txt")):
        shutil.copyfile(f, dest / f.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
