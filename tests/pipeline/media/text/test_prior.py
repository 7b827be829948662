"""The folder prior: a folder's confident readings decide its ambiguous files, softly."""

import codecs

import pytest

from pipeline.media.text.encodings import decode_bytes
from pipeline.media.text.prior import FolderFile, by_folder
from tests.text_samples import LANGUAGES


def _folder(texts: list[str], enc: str) -> list[FolderFile]:
    out = []
    for t in texts:
        data = t.encode(enc)
        d = decode_bytes(data)
        out.append(FolderFile(data, d.text, d.encoding, d.confidence))
    return out


def _sentences(lang: str) -> list[str]:
    return [s.strip() + "." for s in LANGUAGES[lang][1].split(".") if len(s.strip()) > 20]


def _short_words(lang: str) -> list[str]:
    """One-word captions of the sample's words beyond ASCII: too little for any per-file detector."""
    words = {w.strip(".,:!") for w in LANGUAGES[lang][1].split()}
    return sorted(w for w in words if len(w) > 3 and not w.isascii())


FOLDERS = ["tr", "pl", "cs", "es", "ru", "uk", "ar", "he"]


@pytest.mark.parametrize("lang", FOLDERS)
def test_ambiguous_files_take_the_folders_encoding_when_they_read_as_plausibly_in_it(lang):
    enc = LANGUAGES[lang][0][0]
    confident, short = _sentences(lang), _short_words(lang)
    files = _folder(confident + short, enc)
    chosen = by_folder(files)
    right = sum(c.text == t for c, t in zip(chosen, confident + short, strict=True))
    alone = sum(f.text == t for f, t in zip(files, confident + short, strict=True))
    assert right >= alone  # never worse than per file
    assert [c.text for c in chosen[: len(confident)]] == confident  # the confident keep their reading
    for c, f in zip(chosen, files, strict=True):
        if c.by_prior:
            assert c.encoding == codecs.lookup(enc).name and f.encoding != c.encoding
            assert "other files of its folder" in c.note


def test_the_prior_reads_short_captions_per_file_detection_gets_wrong():
    cases = [(lang, LANGUAGES[lang][0][0]) for lang in FOLDERS]
    fixed = 0
    for lang, enc in cases:
        texts = _sentences(lang) + _short_words(lang)
        fixed += sum(c.by_prior and c.text == t for c, t in zip(by_folder(_folder(texts, enc)), texts, strict=True))
    assert fixed >= 10


def test_a_confident_file_in_another_code_page_keeps_its_reading():
    folder = _sentences("ru")
    files = _folder(folder, "cp1251") + _folder([folder[0]], "koi8_r")
    assert files[-1].encoding == "koi8-r"
    chosen = by_folder(files)
    assert (chosen[-1].text, chosen[-1].encoding, chosen[-1].by_prior) == (folder[0], "koi8-r", False)


def test_no_clear_leader_decides_nothing_and_order_does_not_matter():
    texts, short = _sentences("ar"), _short_words("ar")
    misread = [w for w in short if decode_bytes(w.encode("cp1256")).text != w]
    files = _folder(texts[:2] + misread, "cp1256")
    assert not any(c.by_prior for c in by_folder(files[:3]))  # fewer than MIN_SUPPORT others
    more = _folder(texts + short, "cp1256")
    forward = by_folder(more)
    backward = by_folder(more[::-1])[::-1]
    assert forward == backward


def test_the_priors_reading_goes_through_the_text_stage_with_its_note():
    from pipeline.media.text.clean import clean_text

    texts = _sentences("ar") + _short_words("ar")
    files = _folder(texts, "cp1256")
    chosen = by_folder(files)
    decided = [(f, c, t) for f, c, t in zip(files, chosen, texts, strict=True) if c.by_prior]
    assert decided
    for f, c, t in decided:
        reading = c.decoded()
        o = clean_text(f.data, reading=reading)
        assert (o.reason, o.text, o.encoding) == (None, t, "cp1256")
        assert o.content_hash and o.minhash and c.note in o.notes
        assert reading.text == c.text  # the caller's reading is left as it was


def _read_as(text: str, enc: str, read_as: str, confidence: float = 0.95) -> FolderFile:
    """A file of ``text`` in ``enc`` that per-file detection read in ``read_as``."""
    data = text.encode(enc)
    return FolderFile(data, data.decode(read_as), read_as, confidence)


def test_the_folder_leads_by_the_files_that_tell_two_code_pages_apart():
    # Spanish reads the same in cp1252 and cp1250 but for "ñ ¿ ¡": the captions without them say
    # nothing between the two, and must not make a misread "Tamańo" look as supported as its truth
    captions = ["¿Dónde está la estación?", "El niño juega en el jardín", "Mañana será otro día",
                "La señora lee un periódico", "Canción de cuna", "Una película española", "¡Qué día más bonito!",
                "Información del país", "Música clásica", "Un árbol en el campo", "Educación física"]
    files = _folder(captions, "cp1252")
    misread = _read_as("Tamaño inválido", "cp1252", "cp1250", 0.475)
    chosen = by_folder([*files, misread])
    assert (chosen[-1].text, chosen[-1].encoding, chosen[-1].by_prior) == ("Tamaño inválido", "cp1252", True)


def test_a_reading_with_letters_the_folder_never_shows_is_not_taken_over_one_without():
    # a Czech folder in cp1250 holding an ISO-8859-2 caption read right: cp1250 reads its "š" as "ą",
    # a letter of Polish and Lithuanian that no Czech caption of the folder has
    folder = [s for s in _sentences("cs") if not s.isascii()]
    files = _folder(folder, "cp1250")
    intruder = _read_as("greška pri čekanju na naredbu", "iso8859_2", "iso8859-2")
    chosen = by_folder([*files, intruder])
    assert "ą" in intruder.data.decode("cp1250")
    assert (chosen[-1].text, chosen[-1].by_prior) == ("greška pri čekanju na naredbu", False)


def test_misread_files_that_agree_with_each_other_do_not_make_their_signs_the_folders():
    # MacCyrillic captions: per file, some read as cp1251, where the capital "С" is a quote ("‘писок");
    # the alphabet that tells is that of the files read in the folder's leading encoding
    folder = _sentences("ru")
    files = _folder(folder, "mac_cyrillic")
    assert all(f.encoding == "mac-cyrillic" for f in files if f.text is not None and not f.data.isascii())
    misread = [_read_as(t, "mac_cyrillic", "cp1251", 0.98) for t in ("Сирийский язык", "Список файлов", "Сеть")]
    chosen = by_folder(files + misread)
    assert [(c.text, c.encoding) for c in chosen[-3:]] == [
        ("Сирийский язык", "mac-cyrillic"), ("Список файлов", "mac-cyrillic"), ("Сеть", "mac-cyrillic")]


def test_a_reading_in_another_script_counts_as_unseen_even_in_ideographs():
    # a Persian caption with "گ", a letter no Arabic caption of the folder has, read per file as
    # GB18030 ideographs: the folder has no ideographs either, so its own reading is no less odd
    folder = _sentences("ar")
    files = _folder(folder, "cp1256")
    misread = _read_as("گلستان", "cp1256", "gb18030", 0.487)
    assert "گ" not in "".join(folder)
    chosen = by_folder([*files, misread])
    assert (chosen[-1].text, chosen[-1].encoding, chosen[-1].by_prior) == ("گلستان", "cp1256", True)
