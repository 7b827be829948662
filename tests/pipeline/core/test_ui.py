"""Progress when stderr is a log (CI, nohup, a pipe): plain lines now and then, never silence."""

import pytest

from pipeline.core import ui


class Clock:
    """Stands in for the time module inside ui: the test says how much time each file takes."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(ui, "time", c)
    return c


def _run(clock, total, seconds_each, description="clean"):
    with ui.progress(description, total) as advance:
        for i in range(total):
            clock.now += seconds_each
            advance(i % 10 != 0, reused=False)


def test_a_long_run_into_a_log_prints_a_line_every_tenth(clock, capsys):
    _run(clock, 1000, 0.1)  # 100 s in all: one line per 10% (10 s each)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10
    assert lines[0] == "clean: 100/1000 (10%), 90 ok, 10 quarantined, 0 reused, 10s elapsed, about 1m30s left"
    assert lines[-1].startswith("clean: 1000/1000 (100%), 900 ok, 100 quarantined")


def test_lines_come_at_least_10_s_apart_and_at_most_a_minute(clock, capsys):
    _run(clock, 100_000, 0.001)  # 100 s: 10% every 10 s, no more often than that
    assert len(capsys.readouterr().err.splitlines()) == 10
    _run(clock, 100, 10.0)  # 1000 s: 10% takes 100 s, but a minute is the longest silence
    lines = capsys.readouterr().err.splitlines()
    assert 16 <= len(lines) <= 18 and "60/100 (60%)" in lines[9]


def test_a_short_run_prints_nothing(clock, capsys):
    _run(clock, 50, 0.1)
    assert capsys.readouterr().err == ""


def test_an_unknown_total_counts_and_time(clock, capsys):
    with ui.progress("check shards", None, counts=False) as advance:
        for _ in range(30):
            clock.now += 1.0
            advance(True)
    assert capsys.readouterr().err.splitlines()[0] == "check shards: 10 done, 10s elapsed"


# -- names on a terminal (issue 24, item 10) ------------------------------------------------------------

HOSTILE = ["cat\x1b[31mRED\x1b[0m", "dog\x1b]0;pwned\x07", "fox\u202eeulb", "a\nfake line", "csi\x9b2J", "[bold]x[/bold]"]
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


def test_shown_escapes_what_a_terminal_acts_on_and_nothing_else():
    assert ui.shown("café/chat noir 猫.jpg") == "café/chat noir 猫.jpg"  # printable text stays as it is
    assert [ui.shown(n) for n in HOSTILE] == ["cat\\x1b[31mRED\\x1b[0m", "dog\\x1b]0;pwned\\x07", "fox\\u202eeulb",
                                              "a\\nfake line", "csi\\x9b2J", "[bold]x[/bold]"]
    assert ui.shown(KeyError("k\x1b")) == "'k\\x1b'"  # any object: its str()


def test_tables_and_json_print_names_inert(capsys):
    """A summary table prints a name's markup as text and its escapes escaped; --json stays the same
    JSON (json.loads gives the names back) without a raw control character in it."""
    import json

    ui.summary_table(f"pipe clean -> {HOSTILE[1]}", [(name, name) for name in HOSTILE])
    ui.print_json({"classes": HOSTILE})
    out = capsys.readouterr().out
    assert not any(c in out for c in RAW)
    assert "[bold]x[/bold]" in out and "\\x1b[31mRED" in out
    assert json.loads(out[out.index("{"):])["classes"] == HOSTILE
