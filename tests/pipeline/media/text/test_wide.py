"""UTF-16 without a byte-order mark, told by its byte pattern: short texts of one alphabet (no
NULs, often no space), short Japanese without punctuation, and what must stay binary or legacy."""

import random

import numpy as np
import pytest

from pipeline.media.text.encodings import decode_bytes

# (script, its letters): words drawn from the block's letters at random, so the rule is tested on
# the byte pattern, not on chosen words
ALPHABETS = {
    "greek": "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώ",
    "cyrillic": "абвгдежзийклмнопрстуфхцчшщъыьэюя",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשת",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "thai": "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮ",
}


@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("script", sorted(ALPHABETS))
def test_short_text_of_one_alphabet_without_bom_or_space_is_read(script, enc):
    rng = random.Random(script + enc)
    letters = ALPHABETS[script]
    for n in (3, 5, 8, 13, 30):
        text = "".join(rng.choice(letters) for _ in range(n))
        d = decode_bytes(text.encode(enc))
        assert (d.text, d.encoding) == (text, enc), (text, d.detail)
        assert "byte pattern" in d.notes[0]


@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
def test_vietnamese_utf16_without_bom_is_read(enc):
    # Latin Extended Additional (U+1E00-U+1EFF) is Vietnamese's, beside ASCII and its spaces
    rng = random.Random(enc)
    extra = "".join(chr(c) for c in range(0x1EA0, 0x1EFA))
    for _ in range(5):
        words = ["".join(rng.choice("aeiouctnhgm" + extra) for _ in range(rng.randint(2, 6))) for _ in range(4)]
        text = " ".join(words)
        d = decode_bytes(text.encode(enc))
        assert (d.text, d.encoding) == (text, enc)


@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
def test_short_japanese_with_kana_and_no_punctuation_is_read(enc):
    rng = random.Random(enc)
    kana = [chr(c) for c in range(0x3042, 0x3093)] + [chr(c) for c in range(0x30A2, 0x30F3)]
    kanji = "日本語標準出力書込認証複数値指定外部制約持"
    for n in (4, 7, 12):
        text = "".join(rng.choice(kana if i % 2 else kanji) for i in range(n))
        d = decode_bytes(text.encode(enc))
        assert (d.text, d.encoding) == (text, enc), d.detail


@pytest.mark.parametrize("lo", [0x0000, 0x0300, 0x0400, 0x0600])
def test_16_bit_numbers_within_one_block_are_not_read_as_text(lo):
    # a 10-bit sensor's readings: every other byte is one value, as in a short alphabetic text
    values = np.random.default_rng(lo).integers(lo, lo + 256, 200).astype("<u2")
    d = decode_bytes(values.tobytes())
    assert d.reason == "binary_content" or not (d.encoding or "").startswith("utf-16"), d.text


@pytest.mark.parametrize("enc", ["cp1251", "cp1253", "cp1255", "cp1256", "koi8_r", "cp874"])
def test_short_legacy_text_is_never_taken_for_alphabetic_utf16(enc):
    rng = random.Random(enc)
    script = {"cp1251": "cyrillic", "koi8_r": "cyrillic", "cp1253": "greek", "cp1255": "hebrew",
              "cp1256": "arabic", "cp874": "thai"}[enc]
    for _ in range(20):
        text = "".join(rng.choice(ALPHABETS[script]) for _ in range(rng.choice((4, 6, 10))))
        try:
            data = text.encode(enc)
        except UnicodeEncodeError:
            continue
        assert not (decode_bytes(data).encoding or "").startswith("utf-16")
