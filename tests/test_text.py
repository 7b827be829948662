"""One text in, UTF-8 NFC text out or a reason: normalisation, mojibake, fingerprints."""

import unicodedata

import ftfy.bad_codecs  # noqa: F401 - registers "sloppy-windows-1252", how browsers and Excel mis-decode
import pytest

from pipeline.text import TextSettings, clean_text, text_hash
from tests.text_samples import LANGUAGES, VALID_UNICODE


@pytest.mark.parametrize("text", VALID_UNICODE, ids=range(len(VALID_UNICODE)))
def test_correct_text_in_any_language_comes_out_unchanged(text):
    o = clean_text(text.encode("utf-8"))
    assert o.reason is None and o.notes == []
    assert o.text == unicodedata.normalize("NFC", text) == text


@pytest.mark.parametrize("text,original,how", [
    ("café".encode().decode("latin-1"), "café", "utf-8 read as latin-1"),
    ("It’s a “fine” day – isn’t it?".encode().decode("sloppy-windows-1252"), "It’s a “fine” day – isn’t it?", "utf-8 read as windows-1252"),
    ("Привет, мир! Как дела?".encode().decode("cp1252"), "Привет, мир! Как дела?", "utf-8 read as windows-1252"),
    ("今天天气很好，我们去公园散步。".encode().decode("latin-1"), "今天天气很好，我们去公园散步。", "utf-8 read as latin-1"),
    ("你好世界，今天天气很好呀".encode().decode("gbk"), "你好世界，今天天气很好呀", "utf-8 read as gbk"),
    ("Straße".encode().decode("cp1252").encode().decode("cp1252"), "Straße", "utf-8 read as windows-1252"),
])
def test_certain_mojibake_is_repaired_and_says_so(text, original, how):
    o = clean_text(text.encode("utf-8"))
    assert o.reason is None
    assert o.text == original
    assert f"repaired mojibake ({how})" in o.notes


def test_repair_can_be_turned_off():
    o = clean_text("café".encode().decode("latin-1").encode(), TextSettings(repair_mojibake=False))
    assert o.reason == "garbled_text"


@pytest.mark.parametrize("text", [
    "It’s “fine” said the cat".encode().decode("cp1252", "replace"),  # the closing quote was lost
    "日本語のテキストです".encode().decode("cp1252", "replace"),
    "the caf\ufffd is open",  # U+FFFD left by an earlier lossy conversion
    "锟斤拷烫烫烫\ufffd",
])
def test_lossy_or_uncertain_garbage_is_garbled(text):
    o = clean_text(text.encode("utf-8"))
    assert o.reason == "garbled_text" and o.text is None
    assert o.detail


def test_mojibake_in_a_legacy_file_is_seen_after_decoding():
    # UTF-8 French read as cp1252 and saved as cp1252: decoding gives back the mojibake
    moj = "Le café était très agréable.".encode().decode("cp1252")
    o = clean_text(moj.encode("cp1252"))
    assert o.text == "Le café était très agréable."


def test_normalisation_newlines_controls_nfc_bom():
    raw = "\ufeffline one\r\nline two\rline three\x0cpage\u2028sep\x00\x1b[0m e\u0301\tend"
    o = clean_text(raw.encode("utf-8"))
    assert o.text == "line one\nline two\nline three\npage\nsep[0m é\tend"
    assert any("control" in n for n in o.notes)


@pytest.mark.parametrize("raw", [b"   \n\r\n\t  ", "\ufeff".encode(), b"\x1b\x1b\n", "\u2028\u2029".encode()])
def test_nothing_left_is_empty_text(raw):
    assert clean_text(raw).reason == "empty_text"


def test_every_text_records_encoding_and_confidence():
    for data in [b"ascii", "€".encode("cp1252") * 30, "é".encode("utf-16")]:
        o = clean_text(data)
        assert o.encoding and o.confidence is not None


def test_exact_duplicate_hash_ignores_line_endings_bom_and_trailing_space():
    a = clean_text(b"a grey cat\r\non a mat  \r\n")
    b = clean_text(b"\xef\xbb\xbfa grey cat\non a mat\n")
    c = clean_text("a grey cat\non a mat".encode("utf-16"))
    assert a.content_hash == b.content_hash == c.content_hash
    assert a.content_hash != clean_text(b"a grey cat on a mat").content_hash
    assert text_hash("x") != text_hash("X")


def test_fingerprints_for_near_duplicates_are_compact():
    o = clean_text(LANGUAGES["de"][1].encode())
    assert isinstance(o.minhash, str) and len(o.minhash) < 100
