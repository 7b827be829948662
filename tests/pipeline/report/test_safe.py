"""Strings from files are hostile: escaped, and hidden characters made visible."""

from pipeline.report import safe, thumbs
from tests.report_fixtures import bomb_png


def test_markup_and_quotes_are_escaped():
    assert safe.text("<script>\"x\" & 'y'") == "&lt;script&gt;&quot;x&quot; &amp; &#x27;y&#x27;"
    assert safe.attr("a\"><img src=x>") == "a&quot;&gt;&lt;img src=x&gt;"


def test_bidi_overrides_and_undecodable_bytes_are_shown_not_applied():
    assert safe.text("gpj\u202eexe.jpg") == 'gpj<span class="esc">\\u202e</span>exe.jpg'
    name = b"bad\xff.jpg".decode("utf-8", "surrogateescape")  # how Python keeps a non-UTF-8 file name
    assert safe.text(name) == 'bad<span class="esc">\\xff</span>.jpg'
    assert safe.text(b"x\xfe") == 'x<span class="esc">\\xfe</span>'
    assert safe.attr("a\u2066b\x00") == "a\\u2066b\\x00"
    assert safe.text(name).encode("utf-8")  # writable as UTF-8 at all


def test_long_strings_are_cut():
    assert len(safe.text("a" * 10_000)) < 400


def test_a_bomb_or_garbage_becomes_a_labelled_placeholder():
    assert thumbs.from_bytes(bomb_png()) == thumbs.Thumb(why="no preview: decompression_bomb")
    t = thumbs.from_bytes(b"\xff\xd8\xff\xe0garbage")
    assert not t.uri and t.why.startswith("no preview")
