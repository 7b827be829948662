"""Decoding accuracy on real text: ours against the naive way (chardet.detect on the whole
file, then decode), on translations from the machine's gettext catalogs (real sentences in some
40 languages, written by people, not by us), each encoded in the legacy code pages its language
was written in: GBK, Big5, Shift_JIS, EUC-KR, cp1250-cp1257, KOI8, ISO-8859-2/7/13/15, DOS
cp866, MacCyrillic, TIS-620, ...

Two kinds of file: short messages (a caption, a label, a line: 8-400 characters, where detection
is hardest) and documents (2-30 KB of messages, one per line). A file counts as right only when
the decoded text equals the original exactly; a file not right is either refused (no text:
honest) or WRONG (other text, without a word: the failure that costs days). Also prints the
time per file of each way (on a shared machine, a rough figure: bench/clean_text.py measures
speed properly).

    python bench/text_accuracy.py                          # /usr/share/locale, seed 0
    python bench/text_accuracy.py --catalogs DIR --seed 7
"""

from __future__ import annotations

import argparse
import gettext
import random
import struct
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WESTERN = ("cp1252", "iso8859_15")
CENTRAL = ("cp1250", "iso8859_2")
LEGACY = {  # gettext language -> the code pages its text was written in before UTF-8
    **{lang: WESTERN for lang in "fr de es it pt pt_BR sv da nl fi ca nb gl eu id".split()},
    **{lang: CENTRAL for lang in "pl cs sk hu hr sl ro".split()},
    "ru": ("cp1251", "koi8_r", "iso8859_5", "cp866", "mac_cyrillic"), "uk": ("cp1251", "koi8_u"),
    "bg": ("cp1251",), "be": ("cp1251",), "sr": ("cp1251",), "el": ("cp1253", "iso8859_7"),
    "tr": ("cp1254", "iso8859_9"), "he": ("cp1255", "iso8859_8"), "ar": ("cp1256", "iso8859_6"), "fa": ("cp1256",),
    "lt": ("cp1257", "iso8859_13"), "lv": ("cp1257", "iso8859_13"), "et": ("cp1257", "iso8859_15"),
    "th": ("cp874", "tis_620"), "vi": ("cp1258",), "ja": ("shift_jis", "cp932", "euc_jp"),
    "zh_CN": ("gbk", "gb18030", "gb2312"), "zh_TW": ("big5", "cp950"), "ko": ("euc_kr", "cp949"),
}


def messages(catalogs: Path, lang: str) -> list[str]:
    """Every translated message of the language's catalogs with a non-ASCII character."""
    out = set()
    for mo in sorted((catalogs / lang / "LC_MESSAGES").glob("*.mo")):
        try:
            with open(mo, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeError, LookupError, ValueError, struct.error):
            continue  # a catalog gettext cannot read (bad magic, truncated, undeclared charset)
        out.update(v for v in catalog.values()
                   if isinstance(v, str) and not v.isascii() and 8 <= len(v) <= 400 and "\x00" not in v)
    return sorted(out)


def build(catalogs: Path, seed: int, shorts: int = 40, docs: int = 4) -> list[tuple[str, str, str, str]]:
    """(kind, language, encoding, text) for each file."""
    rng = random.Random(seed)
    cases = []
    for lang, encodings in LEGACY.items():
        msgs = messages(catalogs, lang)
        for enc in encodings:
            fits = []
            for m in msgs:
                try:
                    if not m.encode(enc).isascii():
                        fits.append(m)
                except UnicodeEncodeError:
                    pass
            if len(fits) < 10:
                continue
            cases += [("short", lang, enc, m) for m in rng.sample(fits, min(shorts, len(fits)))]
            for _ in range(docs):
                size, parts = rng.randint(2_000, 30_000), []
                while sum(map(len, parts)) < size:
                    parts.append(rng.choice(fits))
                cases.append(("document", lang, enc, "\n".join(parts)))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalogs", type=Path, default=Path("/usr/share/locale"), help="a gettext locale folder")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from naive import chardet_decode

    from pipeline.media.text.encodings import decode_bytes

    def naive(data: bytes) -> str | None:
        return chardet_decode(data)[0]

    ways = {"ours": lambda data: decode_bytes(data).text, "naive": naive}
    cases = build(args.catalogs, args.seed)
    if not cases:
        sys.exit(f"no gettext catalogs with legacy-encodable translations under {args.catalogs}")
    right, refused, seconds, files = Counter(), Counter(), Counter(), Counter()
    wrong = defaultdict(Counter)
    for way in ways.values():  # load chardet's models before timing
        way("é".encode("cp1252") * 8)
    for kind, lang, enc, text in cases:
        data = text.encode(enc)
        files[kind] += 1
        for name, way in ways.items():
            t0 = time.process_time()
            got = way(data)
            seconds[name, kind] += time.process_time() - t0
            right[name, kind] += got == text
            refused[name, kind] += got is None
            wrong[name][f"{lang} {enc}"] += got != text
    print(f"{len({c[1] for c in cases})} languages, {len({(c[1], c[2]) for c in cases})} (language, encoding) pairs, "
          f"seed {args.seed}, catalogs {args.catalogs}")
    print(f"{'files':<16}{'ours right':>12}{'refused':>8}{'WRONG':>6}{'naive right':>13}{'refused':>8}{'WRONG':>6}"
          f"{'ours ms':>9}{'naive ms':>10}")
    for kind in ("short", "document"):
        n = files[kind]
        cols = ""
        for name in ("ours", "naive"):
            ok, no = right[name, kind], refused[name, kind]
            cols += f"{ok:>{7 if name == 'ours' else 8}} {ok / n:>4.0%}{no:>8}{n - ok - no:>6}"
        print(f"{f'{n} {kind}':<16}{cols}{1000 * seconds['ours', kind] / n:>9.2f}{1000 * seconds['naive', kind] / n:>10.2f}")
    for name in ways:
        worst = ", ".join(f"{k} {v}" for k, v in wrong[name].most_common(6) if v)
        print(f"most wrong, {name}: {worst}")


if __name__ == "__main__":
    main()
