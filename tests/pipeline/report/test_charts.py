"""Charts a user can put on a slide (issue 25 item 7): round ticks on both axes, legends in the
colours of their lines, fractions as percentages where the console prints percentages."""

from __future__ import annotations

import re

import pytest

from pipeline.report import charts


@pytest.mark.parametrize("lo,hi,whole,want", [
    (0.0667, 2.1, False, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]),
    (1, 30, True, [0, 5, 10, 15, 20, 25, 30]),
    (1, 3, True, [1, 2, 3]),
    (3, 3, True, [2, 3, 4]),
    (0.6, 0.93, False, [0.6, 0.7, 0.8, 0.9, 1.0]),
])
def test_ticks_are_round_and_span_the_data(lo, hi, whole, want):
    got = charts.ticks(lo, hi, whole=whole)
    assert got == pytest.approx(want)
    assert got[0] <= lo and got[-1] >= hi


def test_a_line_chart_has_ticks_on_both_axes_and_a_coloured_legend():
    svg = charts.lines("loss", "step", list(range(1, 31)), {"global": [1 / s for s in range(1, 31)],
                                                          "rank 0": [1.1 / s for s in range(1, 31)]}, "loss")
    ys = re.findall(r'text-anchor="end" class="val">([^<]+)</text>', svg)
    xs = re.findall(r'text-anchor="middle" class="val">([^<]+)</text>', svg)
    assert len(ys) >= 4 and len(xs) >= 4, (ys, xs)  # not only min and max
    legend = re.search(r'<g class="legend">(.*?)</g>', svg).group(1)
    for name, colour in (("global", charts.COLOURS[0]), ("rank 0", charts.COLOURS[1])):
        assert f'fill="{colour}" font-weight="600">{name}</text>' in legend


def test_no_rule_of_the_style_sheet_paints_legend_text():
    """A rule that sets `fill` on the legend's text wins over its fill attribute: the bug that
    made every legend grey. The browser test checks the pixels; this checks the sheet."""
    from pipeline.report.render import STYLE

    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", STYLE):
        if "fill" in body:
            for sel in selectors.split(","):
                last = sel.strip().split()[-1]
                assert last.startswith(".") and last not in (".legend", ".legend text"), sel


def test_accuracy_shows_as_percent():
    svg = charts.lines("validation accuracy", "epoch", [1, 2, 3], {"val acc": [0.61, 0.7, 0.825]}, "accuracy", percent=True)
    assert "82.5%" in svg and "accuracy (%)" in svg
    assert re.search(r">\d+%</text>", svg)


def test_a_bar_chart_beside_its_numbers_has_no_second_table():
    assert "<table" in charts.bars("x", ["a"], [1]) and "<table" not in charts.bars("x", ["a"], [1], with_table=False)
