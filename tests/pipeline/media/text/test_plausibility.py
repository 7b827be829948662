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
