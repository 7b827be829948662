"""Our own reading of a legacy file: what the quick pass settles alone, and what it leaves to the
full detection."""

import random

import pytest

from pipeline.media.text import guesses
from pipeline.media.text.encodings import decode_bytes
from tests.text_samples import CONFUSABLE, LANGUAGES


def _quick(data: bytes):
    """What the quick pass (modern-web encodings only) decides on its own, or None."""
    import chardet

    start = max(0, guesses.first_high_byte(data) - 256)
    return guesses.quick_guess(chardet, data, data[start : start + guesses.DETECT_WINDOW])


@pytest.mark.parametrize("lang,enc", [("zh-Hans", "gbk"), ("zh-Hant", "big5"), ("ja", "shift_jis"), ("ko", "euc_kr"),
                                      ("ru", "koi8_r"), ("uk", "cp1251"), ("de", "cp1252"), ("pl", "cp1250"),
                                      ("el", "cp1253"), ("tr", "cp1254"), ("he", "cp1255"), ("ar", "cp1256")])
def test_the_quick_pass_decides_ordinary_legacy_text(lang, enc):
    """The common case costs one chardet call over a third of the candidates, and gets it right."""
    text = LANGUAGES[lang][1] * 3
    d = _quick(text.encode(enc))
    assert d is not None and d.text == text


@pytest.mark.parametrize("text,enc,why", [
    ("Izbrana možnost omogoča, da se oznaka uporabi za izbrane datoteke. Določa ali so vrednosti svetlosti "
     "obrnjene: temnejše barve so svetlejše. " * 10, "iso8859_2",
     'cp1250, the guess, reads it as clean letters too: "moľnost", "temnejąe"'),
    (LANGUAGES["pl"][1] * 10, "iso8859_2", 'cp1250 puts "±" and "¶" beside letters'),
    (LANGUAGES["fr"][1] * 30 + " Le cœur de l'œuvre coûte 15 €.", "iso8859_15",
     'the only "œ" and "€" come after the window: cp1252 reads them "½" and "¤"'),
    (CONFUSABLE["el"][1] * 5, "iso8859_7", 'cp1253 reads "Ά" as "¶"'),
    (CONFUSABLE["ru"][1] * 5, "mac_cyrillic", 'cp1251 reads "я" as "Я" ("мЯгких"); no modern code page fits'),
], ids=["sl-iso8859_2", "pl-iso8859_2", "fr-iso8859_15-late", "el-iso8859_7", "ru-mac_cyrillic"])
def test_what_the_quick_pass_cannot_settle_goes_to_the_full_detection(text, enc, why):
    data = text.encode(enc)
    assert _quick(data) is None, why
    assert decode_bytes(data).text == text


# Maltese names of countries and languages, one a line (a list of class names): "Ġ Ħ Ċ" start
# many of them
_MALTESE = ("Ġappuniż", "Ħawajjan", "Ċipewjan", "Ġermaniż", "Maċedonjan", "Alġerija", "Arġentina", "Ażerbajġan",
            "Gżejjer Kajman", "Kaledonja l-Ġdida", "Ħong Kong", "Raġastani", "Luwisinuż", "Finlandiż", "Olandiż",
            "Irlandiż, Antik (sa l-900)", "Użbekistan", "Veneżwela", "Indoneżja", "Ċina", "Ħungerija", "Ġorġja",
            "Gżejjer Faroe", "Stati Federati tal-Mikroneżja", "Żimbabwe", "Afriħili", "Sundaniż", "Ingliż")


@pytest.mark.parametrize("lines", [30, 300, 600, 1000, 3000])
def test_maltese_in_iso8859_3_is_not_read_as_a_more_common_code_page(lines):
    # "ċ ġ ħ" are ISO-8859-2's "ĺ ő ą": no symbol out of place, but letters of three languages at once
    for seed in range(3):
        rng = random.Random(seed * 7919 + lines)
        text = "\n".join(rng.choice(_MALTESE) for _ in range(lines))
        d = decode_bytes(text.encode("iso8859_3"))
        assert (d.text, d.encoding) == (text, "iso8859-3"), d.encoding
