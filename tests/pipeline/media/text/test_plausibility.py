"""How wrong a reading looks: Latin words in East Asian text are not odd, Latin text misread as
a multi-byte code page is."""

import pytest

from pipeline.media.text.plausibility import oddities


@pytest.mark.parametrize("text,codec", [
    ("在IE中为abbr标签加样式，使用CSS布局的教程。", "gb18030"),
    ("時々、人々はPythonでコードを書きます。サーバーのデータ。", "cp932"),  # 々 and ー are Japanese too
    ("PC에서 CSS를 사용합니다.", "cp949"),
], ids=["zh", "ja", "ko"])
def test_latin_words_set_in_east_asian_text_are_not_odd(text, codec):
    """No spaces around a Latin word in Chinese or Japanese, a Korean particle attached to it:
    not a change of script within a word."""
    data = text.encode(codec)
    assert oddities(data.decode(codec), data, codec) == 0


def test_latin_text_misread_as_a_multibyte_code_page_still_looks_odd():
    """A cp1252 text read as GB18030 pairs each accented letter with the next one: a lone
    ideograph inside a Latin word ("d間o鹴ant")."""
    data = "Un goût dégoûtant: Mélanie étonnée.".encode("cp1252")
    assert oddities(data.decode("gb18030"), data, "gb18030") > 0


@pytest.mark.parametrize("text,codec", [
    ("»%.250s« kann nicht als »%.250s« installiert werden", "iso8859_15"),  # a placeholder's "250s"
    ("Fitxategiaren huts·egin·da: denboraz kanpo.", "iso8859_15"),  # Basque hyphenation
    ("Benvinguts a tots els col·laboradors i amic·ues", "cp1252"),  # Catalan, inclusive writing
])
def test_what_every_code_page_reads_alike_or_a_separator_is_not_implausible(text, codec):
    """ASCII reads the same in every code page, so a letter after a digit tells only when it is
    beyond ASCII ("10Ł" for "10£"); a middle dot between letters is a separator in Catalan,
    Basque and inclusive French, which no misread letter needs to explain."""
    from pipeline.media.text.plausibility import penalty_of

    data = text.encode(codec)
    assert penalty_of(data.decode(codec), data, codec) == 0
    misread = "10£ le kilo".encode("cp1252")
    assert penalty_of(misread.decode("iso8859_2"), misread, "iso8859_2") > 0  # "10Ł"
