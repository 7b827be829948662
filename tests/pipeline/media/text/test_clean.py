"""One text in, UTF-8 NFC text out or a reason: normalisation, mojibake, fingerprints."""

import unicodedata

import ftfy.bad_codecs  # noqa: F401 - registers "sloppy-windows-1252", how browsers and Excel mis-decode
import pytest

from pipeline.media.text.clean import TextSettings, clean_text, text_hash
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


@pytest.mark.parametrize("text", [
    "Azt mondta: »ámulok, hogy ez így van«, és elment. Ő pedig a házban maradt.",  # Hungarian
    "Er sagte: »Öl ist teuer«, und ging. Sie blieb im Haus.",  # German books
], ids=["hu", "de"])
@pytest.mark.parametrize("enc", ["utf-8", "cp1250"])
def test_quotations_opened_with_guillemets_are_not_mojibake(text, enc):
    """ftfy takes "»" for a closing quote, as in French; German and Hungarian open with it."""
    o = clean_text(text.encode(enc))
    assert (o.reason, o.text, o.notes) == (None, text, [])


def test_mojibake_with_a_guillemet_is_still_repaired():
    o = clean_text("C'est sÃ»r, le cafÃ© est bon.".encode())
    assert (o.reason, o.text) == (None, "C'est sûr, le café est bon.")


def test_garbled_text_says_where_with_invisible_characters_escaped():
    """UTF-8 "Ö" read as Latin-1 is "Ã" and the invisible C1 control U+0096: the detail shows it."""
    o = clean_text("Uzsa Ã\x96nko adat gyalogló túrát a hozzáértő érdeklődőknek.".encode())
    assert o.reason == "garbled_text"
    assert 'near "Uzsa Ã\\x96nko' in o.detail


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


# --- through `pipe clean`: the exact bytes written, the reason for every rejected file ---------

CAPTIONS = {  # file -> (bytes on disk, the UTF-8 text pipe must write)
    "gbk.txt": ("一只橘色的小猫躺在沙发上睡觉，旁边放着一本书。".encode("gbk"), "一只橘色的小猫躺在沙发上睡觉，旁边放着一本书。"),
    "big5.txt": ("一隻橘色的小貓躺在沙發上睡覺，旁邊放著一本書。".encode("big5"), "一隻橘色的小貓躺在沙發上睡覺，旁邊放著一本書。"),
    "sjis.txt": ("オレンジ色の子猫がソファで寝ていて、隣に本があります。".encode("shift_jis"),
                 "オレンジ色の子猫がソファで寝ていて、隣に本があります。"),
    "euckr.txt": ("주황색 새끼 고양이가 소파에서 자고 있고 옆에 책이 있습니다.".encode("euc_kr"),
                  "주황색 새끼 고양이가 소파에서 자고 있고 옆에 책이 있습니다."),
    "koi8r.txt": ("Рыжий котёнок спит на диване, рядом лежит книга.".encode("koi8_r"), "Рыжий котёнок спит на диване, рядом лежит книга."),
    "cp1252.txt": ("Un chaton roux dort sur le canapé – à côté, un livre “ouvert”.\r\n".encode("cp1252"),
                   "Un chaton roux dort sur le canapé – à côté, un livre “ouvert”.\n"),
    "utf16le_bom.txt": (b"\xff\xfe" + "Ein Kätzchen schläft.\r\nZweite Zeile".encode("utf-16-le"), "Ein Kätzchen schläft.\nZweite Zeile"),
    "utf16be_bom.txt": (b"\xfe\xff" + "小猫在睡觉。".encode("utf-16-be"), "小猫在睡觉。"),
    "utf16le.txt": ("A kitten sleeps on the sofa.".encode("utf-16-le"), "A kitten sleeps on the sofa."),
    "utf16be.txt": ("Котёнок спит на диване.".encode("utf-16-be"), "Котёнок спит на диване."),
    "utf8_bom.txt": (b"\xef\xbb\xbf" + "Ünïcödé with a BOM\n".encode(), "Ünïcödé with a BOM\n"),
    "mojibake.txt": ("Le café était très agréable.".encode().decode("latin-1").encode(), "Le café était très agréable."),
    "nfd.txt": ("Cafe\u0301 cre\u0300me".encode(), "Café crème"),
}
REJECTED = {  # file -> (bytes, reason)
    "binary.txt": (bytes(range(256)) * 4, "binary_content"),
    "empty.txt": (b"", "zero_bytes"),
    "blank.txt": (b" \r\n\t\r\n", "empty_text"),
    "lossy.txt": ("the caf\ufffd was closed".encode(), "garbled_text"),
    "broken_bom.txt": (b"\xef\xbb\xbfcaf\xe9", "undecodable_text"),
}


def test_pipe_clean_writes_exact_utf8_and_says_why_it_rejects(tmp_path):
    import pyarrow.parquet as pq

    from pipeline.clean import stage as clean
    from pipeline.clean.stage import CleanConfig

    src = tmp_path / "raw"
    src.mkdir()
    for name, (data, _) in {**CAPTIONS, **REJECTED}.items():
        (src / name).write_bytes(data)
    clean.run(CleanConfig(src, tmp_path / "clean", workers=2), show_progress=False)
    rows = {r["source"]: r for r in pq.read_table(tmp_path / "clean" / "manifest.parquet").to_pylist()}
    for name, (_, expected) in CAPTIONS.items():
        r = rows[name]
        assert r["status"] == "kept", (name, r["reason"], r["detail"])
        assert (tmp_path / "clean" / r["output"]).read_bytes() == expected.encode("utf-8"), name
        assert r["encoding"] and r["encoding_confidence"] is not None, name
    assert "repaired mojibake" in rows["mojibake.txt"]["detail"]
    for name, (_, reason) in REJECTED.items():
        assert (rows[name]["status"], rows[name]["reason"]) == ("quarantined", reason), name
        assert rows[name]["output"] == ""
    assert rows["gbk.txt"]["encoding"] == "gb18030" and rows["sjis.txt"]["encoding"] == "cp932"
    assert rows["utf16le.txt"]["encoding"] == "utf-16-le"


@pytest.mark.parametrize("lang_text", [
    "Привіт! Її єнот їсть яблука, а ґава співає. ",  # Ukrainian: many cp1251 lead+continuation pairs
    "Η Ελλάδα είναι όμορφη χώρα «με ήλιο». ",  # Greek
])
def test_one_mojibake_word_deep_inside_a_long_text_is_not_kept_silently(lang_text):
    """The badness scan looks only around suspect spots: one far into a long text still counts."""
    clean = lang_text * 300
    assert clean_text(clean.encode()).notes == []  # the text alone is fine
    moj = clean + "Le cafÃ© est bon. " + clean
    o = clean_text(moj.encode())
    assert o.reason == "garbled_text" or (o.text is not None and "café" in o.text and o.notes), (o.reason, o.notes)
