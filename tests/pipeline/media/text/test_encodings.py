"""Text or binary, and which encoding: every decode strict, the exact text asserted."""

import codecs
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.media.text.codepages import EBCDIC
from pipeline.media.text.encodings import decode_bytes
from tests.text_samples import CONFUSABLE, LANGUAGES

# (language, encoding the file is written in) for every legacy encoding we promise to read
LEGACY = [(lang, enc) for lang, (encs, _t) in LANGUAGES.items() for enc in encs]
CONFUSED = [(lang, enc) for lang, (encs, _t) in CONFUSABLE.items() for enc in encs]


@pytest.mark.parametrize("lang,enc", LEGACY, ids=[f"{lang}-{enc}" for lang, enc in LEGACY])
def test_legacy_encodings_decode_to_the_exact_text(lang, enc):
    text = LANGUAGES[lang][1]
    d = decode_bytes(text.encode(enc))
    assert d.reason is None, d.detail
    assert d.text == text
    assert codecs.lookup(d.encoding)  # a real Python codec name, for the manifest
    assert 0 < d.confidence <= 1


@pytest.mark.parametrize("lang,enc", CONFUSED, ids=[f"{lang}-{enc}" for lang, enc in CONFUSED])
def test_code_pages_that_disagree_on_a_few_letters(lang, enc):
    """ISO-8859-15 "œ€" is cp1252 "½¤", ISO-8859-2 "śą" cp1250 "¶±", ISO-8859-7 "Ά" cp1253 "¶",
    MacCyrillic "я" cp1251 "Я": the exact letters, whichever of the pair the file is in."""
    text = CONFUSABLE[lang][1]
    assert decode_bytes(text.encode(enc)).text == text


@pytest.mark.parametrize("text,enc", [
    ("Vstupní zpráva k\xa0dispozici, v\xa0pořádku a s\xa0úsměvem.", "cp1250"),  # no-break spaces after "k", "v", "s"
    ("Permet la reinstal·lació dels paquets i la col·lecció d'informació.", "cp1252"),  # Catalan "l·l"
    (LANGUAGES["de"][1] + " Müller GmbH® liefert Öfen für 20 €.", "cp1252"),
    (LANGUAGES["uk"][1] + " Потужність 5 кВт, пам'ять 512 МіБ, файл 3 кБ.", "cp1251"),  # units in camelCase
])
def test_real_signs_beside_letters_do_not_mislead(text, enc):
    assert decode_bytes(text.encode(enc)).text == text


@pytest.mark.parametrize("enc", ["gbk", "big5", "shift_jis", "euc_kr", "koi8_r", "cp1252"])
def test_one_sentence_captions(enc):
    """Captions are short: one sentence must be enough."""
    text = {"gbk": "一只橘色的小猫躺在沙发上睡觉。", "big5": "一隻橘色的小貓躺在沙發上睡覺。",
            "shift_jis": "オレンジ色の子猫がソファで寝ています。", "euc_kr": "주황색 새끼 고양이가 소파에서 자고 있습니다.",
            "koi8_r": "Рыжий котёнок спит на диване.", "cp1252": "Un chaton roux dort sur le canapé, “tranquille”."}[enc]
    assert decode_bytes(text.encode(enc)).text == text


@pytest.mark.parametrize("enc,bom", [("utf-16-le", True), ("utf-16-be", True), ("utf-16-le", False),
                                     ("utf-16-be", False), ("utf-32-le", True), ("utf-32-be", False)])
@pytest.mark.parametrize("lang", ["fr", "ru", "zh-Hans", "ja", "ko"])
def test_utf16_and_utf32_with_and_without_bom(enc, bom, lang):
    text = LANGUAGES[lang][1]
    mark = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE,
            "utf-32-le": codecs.BOM_UTF32_LE, "utf-32-be": codecs.BOM_UTF32_BE}[enc]
    d = decode_bytes((mark if bom else b"") + text.encode(enc))
    assert (d.text, d.encoding) == (text, enc)


def test_utf8_with_bom_loses_the_bom_only():
    d = decode_bytes(codecs.BOM_UTF8 + "héllo wörld\n".encode())
    assert (d.text, d.encoding, d.confidence) == ("héllo wörld\n", "utf-8-sig", 1.0)


def test_utf8_is_the_fast_path_with_full_confidence():
    d = decode_bytes(LANGUAGES["ja"][1].encode())
    assert (d.text, d.encoding, d.confidence) == (LANGUAGES["ja"][1], "utf-8", 1.0)


def test_iso2022_jp_is_not_read_as_ascii():
    text = LANGUAGES["ja"][1]
    d = decode_bytes(text.encode("iso2022_jp"))
    assert d.text == text and d.encoding.startswith("iso2022_jp")


def test_legacy_text_whose_first_kilobytes_are_ascii():
    """chardet sees a window starting at the first non-ASCII byte, not 8 KB of English header."""
    text = "Title: travel notes\n" * 600 + LANGUAGES["zh-Hans"][1]
    d = decode_bytes(text.encode("gbk"))
    assert d.text == text and d.encoding == "gb18030"


def test_a_prefix_guess_that_fails_later_falls_back():
    """The first 8 KB look like Windows Shift_JIS (cp932); the end has JIS X 0213 characters
    that only shift_jis_2004 holds. The guess fails on the whole file; the next one is tried."""
    text = LANGUAGES["ja"][1] * 40 + "アイヌ語のㇰとㇱ、そして鷗外と𠀋。"
    data = text.encode("shift_jis_2004")
    with pytest.raises(UnicodeDecodeError):
        data.decode("cp932")
    d = decode_bytes(data)
    assert (d.text, d.encoding) == (text, "shift_jis_2004")
    assert "did not decode the whole file" in d.notes[0]


@pytest.mark.parametrize("data,what", [
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "png-like"),
    (bytes(range(256)) * 8, "all bytes"),
    (b"\x00" * 10, "NULs"),
    (b"\x00\x01\x02\x03binary", "short binary"),
    (bytes([7, 8, 1, 2, 3]) + b"abc", "control bytes, no NUL"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_binary_content(data, what):
    d = decode_bytes(data)
    assert d.reason == "binary_content" and d.text is None


def test_16_bit_integers_are_binary_not_utf16():
    import numpy as np

    d = decode_bytes(np.arange(1000, dtype="<u2").tobytes())
    assert d.reason == "binary_content"


def test_a_stray_control_byte_does_not_make_text_binary():
    d = decode_bytes(b"a caption with a bell\x07 in it, and more words after it")
    assert d.reason is None and "\x07" in d.text  # removed later, by normalisation


def test_undecodable_bytes_are_never_replaced():
    # a UTF-8 byte-order mark followed by bytes that are not UTF-8
    d = decode_bytes(codecs.BOM_UTF8 + b"caf" + b"\xe9 cr\xe8me")
    assert d.reason == "undecodable_text" and d.text is None
    assert "byte 6" in d.detail


def test_truncated_utf16_is_undecodable():
    d = decode_bytes(codecs.BOM_UTF16_LE + "a caption".encode("utf-16-le") + b"a")
    assert d.reason == "undecodable_text" and "truncated" in d.detail


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_never_raises_and_never_lossy(data):
    d = decode_bytes(data)
    assert (d.text is None) == (d.reason is not None)
    if d.text is not None:
        assert "\ufffd" not in d.text or b"\xef\xbf\xbd" in data or d.encoding.startswith("utf-16")\
            or d.encoding.startswith("utf-32")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=200))
def test_any_utf8_text_round_trips(text):
    d = decode_bytes(text.encode("utf-8"))
    assert d.text == text and d.encoding == "utf-8"


def test_iso2022_kr_is_text_not_binary():
    """ISO-2022-KR shifts in and out of Korean with SO/SI control bytes (a fifth of the bytes in
    chardet's own test files): the escape sequence says it is text before the control share does."""
    text = "한국어 텍스트입니다. 이것은 테스트입니다.\n" * 3
    d = decode_bytes(text.encode("iso2022_kr"))
    assert (d.reason, d.text) == (None, text)


# --- a reading that overrides chardet, or a rare code page, must have a real reason -------------

def test_every_reading_is_judged_from_the_same_byte():
    """Shift_JIS-2004 reads the ASCII "~" as "‾": judged from its own first non-ASCII character,
    its window held only English and looked flawless, while cp932's held the Japanese. Both are
    judged from the first high byte, and the tilde stays a tilde."""
    text = "Only ~5% of this file is English; the tilde (~) must stay a tilde.\n" * 100 \
        + "日本語のテキストです。時々、人々はPythonでコードを書きます。データベースのサーバーを使います。\n" * 3
    d = decode_bytes(text.encode("shift_jis"))
    assert (d.text, d.encoding) == (text, "cp932")


def test_a_declared_rare_code_page_is_read_as_declared():
    """A short MacCyrillic page: KZ-1048 reads its capitals as Kazakh letters just as cleanly,
    but a rare code page is taken only with chardet's word, and chardet over the whole file
    (its XML declaration included) reads it as MacCyrillic."""
    text = '<?xml version="1.0" encoding="x-mac-cyrillic"?>\n<title>Новости: Москва и Санкт-Петербург</title>\n'
    d = decode_bytes(text.encode("mac_cyrillic"))
    assert (d.text, d.encoding) == (text, "mac-cyrillic")
    assert "rare code page" in d.notes[0]


def test_an_unconfirmed_rare_code_page_is_refused_not_guessed():
    """One MacRoman apostrophe in 150 KB of ASCII: HP Roman-8 reads it as a clean "í", cp1252 as
    "Õ", chardet has no real opinion. No reading to trust: refused, not decoded silently wrong."""
    text = '"Product"="Daniel Blanchard’s Trackpad #1","Version"=1\n' \
        + "IOService:/AppleACPIPlatformExpert/PCI0@0 <class IOPCIDevice, id 0x100000200>\n" * 2000
    d = decode_bytes(text.encode("mac_roman"))
    assert d.text is None and d.reason == "undecodable_text"
    assert "rare code page" in d.detail


def test_a_rare_code_page_chardet_confirms_keeps_chardets_name():
    """A declared IBM866 page whose letters cp1125 (Ukrainian DOS) reads the same: the manifest
    names the encoding the file declares."""
    text = '<?xml version="1.0" encoding="IBM866"?>\n<title>' + CONFUSABLE["ru"][1] + "</title>\n"
    d = decode_bytes(text.encode("cp866"))
    assert (d.text, d.encoding) == (text, "cp866")


@pytest.mark.parametrize("text", ["Ça va très bien", "Photo of a naïve café", "price: 10£"])
def test_short_western_captions_are_read_as_cp1252(text):
    """chardet, unsure on a few bytes, rates cp1257 "Ēa va trčs bien", cp1250 "naďve" and
    "10Ł" above cp1252: as clean, but with letters those languages hardly ever show."""
    d = decode_bytes(text.encode("latin-1"))
    assert (d.text, d.encoding) == (text, "cp1252")
    assert "cp1252" in d.notes[0]


def test_western_quotes_are_not_read_as_slovak_letters():
    """«» are ISO-8859-2 "Ťť": a quoted Western phrase is not a Slovak word."""
    text = "Cliquez sur «Enregistrer» pour continuer"
    assert decode_bytes(text.encode("iso8859_15")).text == text


def test_ambiguous_garbage_is_not_read_as_western():
    """Broken UTF-8 ("Ã(") has no cp1252 reading with an edge over the others: not turned
    into Western text, and never taken for EBCDIC."""
    d = decode_bytes(b"\xc3\x28 invalid")
    assert d.encoding not in EBCDIC
    assert d.reason == "undecodable_text" or d.text == "Ć( invalid"


def test_high_bytes_without_ebcdic_spaces_are_not_read_as_ebcdic():
    """b"\\x81\\x82\\x83" is EBCDIC "abc", but EBCDIC text has spaces (0x40): refused, not 'abc'."""
    d = decode_bytes(b"\x81\x82\x83")
    assert d.text != "abc" and d.encoding not in EBCDIC
    assert d.text is None and d.reason == "undecodable_text" and d.detail


def test_real_ebcdic_text_is_still_read():
    text = "Ceci est un texte écrit sur un ordinateur central"
    d = decode_bytes(text.encode("cp500"))
    assert d.text == text and d.encoding in EBCDIC


# Real texts nobody here wrote, from packages (bench/data/text_packages/README.md says which):
# Esperanto proverbs (fortunes-eo), Russian fortunes (fortunes-ru), Ukrainian, Greek, Chinese
# and Japanese manual pages (manpages-l10n, manpages-zh, manpages-ja), Chinese fortunes
# (fortunes-zh), Korean bills (konlpy), CPython's CJK codec test files.
PACKAGES = Path(__file__).resolve().parents[4] / "bench" / "data" / "text_packages"
SHORT_REAL = [
    ("Ne ĉiu aspiranto devas esti prenanto", "iso8859_3"),  # read as cp1252 "æiu"
    ("Rusto manĝas feron, ĉagreno la koron", "iso8859_3"),  # as cp1250 "manřas"
    ("Kontraŭ malfeliĉo ne defendas eĉ riĉo", "iso8859_3"),
    ("префіксів) назвами кольорів є такі: pink, purple, mauve, lagoon, mint,", "mac_cyrillic"),  # cp1251 "префґксґв"
    ("PS4, потім команду і її розгорнуті аргументи або пов'язаний список", "mac_cyrillic"),
    ("Что может быть вместительнее пустых голов?\n\t\t-- С.Е.Лец", "mac_cyrillic"),  # cp1251 "—то"
    ("В жизни надо либо копить деньги, либо их тратить.", "mac_cyrillic"),  # cp1251 "‚ жизни"
    ("το ίδιο με --report=state", "cp737"),  # as KOI8-U box drawing
    ("寻寻觅觅，冷冷清清，凄凄惨惨戚戚。\n    -- 李清照《声声慢·寻寻觅觅》", "gb18030"),  # as EUC-JIS-2004
    ("墨写的谎言掩盖不了血写的事实。\n  -- 鲁迅", "hz"),  # passed through as ASCII
    ("<kaczorek> duki: u mnie była w piątek", "cp1250"),  # as ISO-8859-2 "pištek"
    ("Budeš-li pořád s chromými, začneš kulhat.\n\t\t-- latinské přísloví", "iso8859_2"),  # cp1250 "Budeą"
]


@pytest.mark.parametrize("text,enc", SHORT_REAL, ids=[f"{enc}-{i}" for i, (_t, enc) in enumerate(SHORT_REAL)])
def test_short_real_texts_in_the_code_pages_their_languages_used(text, enc):
    """A sentence or two is where a reading chosen from a few letters goes wrong: the reading
    taken is the one plausible for one language throughout, chardet's whole-file answer the floor."""
    d = decode_bytes(text.encode(enc))
    assert d.text == text, (d.encoding, d.text, d.notes)
    assert d.confidence >= 0.7


# Real Esperanto nobody here wrote: messages of the GNU grep, sed and tar catalogs (eo.po, GPL).
# Each has one or two letters beyond ASCII, which cp1250, cp1252 or ISO-8859-2 read as other
# languages' letters just as plausibly ("sufiĉa" as "sufiæa", "arĥivo" as "arśivo"); the words
# around them are Esperanto's, and only ISO-8859-3 has its letters.
ESPERANTO = [
    "%s: mankas sufiĉa memoro",
    "Ĝenerala helpo por uzi programaron GNU: <%s>\n",
    "Ne eblas retropaŝi arĥivan dosieron; ĝi eble ne legeblos sen -i",
    "Malkuraĝe ni rifuzas krei malplenan arĥivon",
    "Komando estis ĉesigata de signalo %d\n",
]
# ...and real texts whose letters ISO-8859-3 reads as Esperanto's, in words that are not: Danish
# and Norwegian (coreutils), Czech (coreutils), Turkish (manpages-tr), Croatian, Lithuanian.
NOT_ESPERANTO = [
    ("kan ikke læse katalog %s", "cp1252"),
    ("kunne ikke sætte gruppe-ID", "cp1252"),
    ("Forespørselen ble ikke avbrutt", "cp1252"),
    ("%s: hodnota nebyla zcela převedena", "cp1250"),
    ("chyba při normalizaci %s", "cp1250"),
    ("Yalnızca wall(1) İLETİsini yazar ama kapatma, durdurma veya yeniden başlatma işlemleri yapılmaz.", "cp1254"),
    ("Boja neposjećene poveznice", "cp1250"),  # Croatian (gtk30)
    ("Vaikai žaidžia prie ežero", "cp1257"),  # Lithuanian (tests/text_samples)
]


@pytest.mark.parametrize("text", [*ESPERANTO, "\n".join(ESPERANTO * 8)],
                         ids=[*(f"short-{i}" for i in range(len(ESPERANTO))), "long"])
def test_esperanto_is_told_by_its_words(text):
    """A short Esperanto text has one letter that only ISO-8859-3 gives; other code pages read it
    as another language's letter, and chardet's whole-file guess is one of them."""
    d = decode_bytes(text.encode("iso8859_3"))
    assert d.text == text, (d.encoding, d.text, d.notes)
    assert d.confidence >= 0.9


@pytest.mark.parametrize("text,enc", NOT_ESPERANTO, ids=[enc + f"-{i}" for i, (_t, enc) in enumerate(NOT_ESPERANTO)])
def test_words_that_are_not_esperanto_keep_their_code_page(text, enc):
    d = decode_bytes(text.encode(enc))
    assert d.text == text, (d.encoding, d.text, d.notes)


@pytest.mark.parametrize("name", ["hz", "cp949", "johab", "gb2312"])
def test_cpythons_cjk_codec_test_files_as_shipped(name):
    data = (PACKAGES / "cjkencodings" / f"{name}.txt").read_bytes()
    truth = (PACKAGES / "cjkencodings" / f"{name}-utf8.txt").read_text("utf-8")
    d = decode_bytes(data)
    assert d.text == truth, (d.encoding, d.notes)


def test_ascii_with_tilde_braces_is_not_hz():
    """HZ's shifts are "~{" and "~}"; ASCII that merely contains them stays what it is."""
    for data in (b"if (x) ~{ y = 1; ~}\n", b"a ~{ab~} b", b"${x~{a}"):
        assert decode_bytes(data).text == data.decode("ascii")


def _long_texts(lang: str, enc: str) -> list[str]:
    texts = json.loads((PACKAGES / f"{lang}.json").read_text("utf-8"))["long"]
    out = []
    for t in texts:
        try:
            t.encode(enc)
        except UnicodeEncodeError:
            continue
        out.append(t)
    return out


LONG_REAL = [("zh_CN", "gbk"), ("zh_CN", "hz"), ("zh_TW", "big5hkscs"), ("ja", "cp932"), ("ko", "cp949"),
             ("de", "cp1252"), ("cs", "iso8859_2"), ("eo", "iso8859_3"), ("el", "iso8859_7"), ("ru", "koi8_r"),
             ("uk", "koi8_u"), ("ru", "iso8859_5"), ("ru", "mac_cyrillic")]


@pytest.mark.parametrize("lang,enc", LONG_REAL, ids=[f"{lang}-{enc}" for lang, enc in LONG_REAL])
def test_long_real_documents_are_read_right_with_a_confidence_that_says_so(lang, enc):
    """Manual pages and runs of fortunes (2-30 KB): the exact text, and a confidence that means
    what it says (it once was 0.07-0.6 for such right readings of GBK, cp1252, ISO-8859-2)."""
    texts = _long_texts(lang, enc)
    assert texts
    for text in texts:
        d = decode_bytes(text.encode(enc))
        assert d.text == text, (d.encoding, d.notes)
        assert d.confidence >= 0.85, (d.encoding, d.confidence)


# Short messages as desktop programs shipped them in a legacy code page (a menu item, a
# changelog line): an even number of bytes, no NULs, and a digit pair ("10" is U+3031 read
# as UTF-16-LE) once made them pass for BOM-less UTF-16 ideographs.
SHORT_LEGACY = [("Ŝalti al laborspaco 10", "iso8859_3"), ("Ĝisdatigi la pakaĵojn 2010", "iso8859_3"),
                ("Ir al área de trabajo 10", "cp1252"), ("Prebaci na radnu površinu 10", "cp1250"),
                ("Μετάβαση στην επιφάνεια 10", "cp1253"), ("Переключиться на стол 10", "koi8_r")]


@pytest.mark.parametrize("text,enc", SHORT_LEGACY, ids=[enc + "-" + str(len(t)) for t, enc in SHORT_LEGACY])
def test_short_legacy_texts_are_not_read_as_utf16_without_a_bom(text, enc):
    data = text.encode(enc)
    assert len(data) % 2 == 0 and b"\x00" not in data
    d = decode_bytes(data)
    assert not d.encoding.startswith("utf-16"), d.text
    assert d.text == text


_LONG_ZH = ("一只橘色的小猫躺在沙发上睡觉，窗外下着小雨。它的主人在厨房里做饭，锅里的汤慢慢地开了。"
            "过了一会儿，小猫醒了，伸了个懒腰，跳到窗台上看雨。邻居家的狗在院子里叫了几声，又安静下来。") * 4
_LONG_JA = ("オレンジ色の子猫がソファで寝ています。窓の外では小雨が降っていて、台所では飼い主が夕食を作っています。"
            "しばらくすると子猫は目を覚まし、大きく伸びをしてから窓辺に飛び乗りました。") * 4
SHORT_AND_LONG_UTF16 = ["東京都は日本の首都です。", "ウィンドウ１０に切り替え", "第１０章　まとめ",
                        "我们明天见吧，好吗？", "今日は良い天気ですね。",
                        "Hello, world.", "Котёнок спит.", _LONG_ZH, _LONG_JA,
                        "Рыжий котёнок спит на диване, а за окном идёт дождь. " * 20,
                        "A ginger kitten sleeps on the sofa while it rains outside. " * 20]


@pytest.mark.parametrize("enc", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("text", SHORT_AND_LONG_UTF16, ids=[f"{t[:6]}-{len(t)}" for t in SHORT_AND_LONG_UTF16])
def test_real_utf16_without_a_bom_short_or_long_is_still_read(text, enc):
    d = decode_bytes(text.encode(enc))
    assert (d.text, d.encoding) == (text, enc)
