"""`--window`: auto, full or two percentiles, one spelling each; anything else one sentence."""

import pytest

from pipeline.media.image.window import AUTO, Window, parse_window


@pytest.mark.parametrize("text, window", [("auto", AUTO), (" FULL ", Window("full")),
                                          ("0.5,99.5", Window("percentile", 0.5, 99.5)),
                                          ("0 , 100", Window("percentile", 0.0, 100.0))])
def test_windows_parse_and_print_back_in_one_spelling(text, window):
    assert parse_window(text) == window
    assert parse_window(str(window)) == window and str(parse_window("0.50, 99.5")) == "0.5,99.5"


@pytest.mark.parametrize("text", ["", "p1,p99", "99,1", "5,5", "0,101", "-1,50", "1,2,3", "nan,50"])
def test_anything_else_is_refused_with_what_to_write(text):
    with pytest.raises(ValueError, match="use auto, full or two percentiles"):
        parse_window(text)
