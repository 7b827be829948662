"""What people see: a progress bar on stderr while work runs (plain lines now and then when
stderr is a log, not a terminal), a summary table at the end.

Machines get `--json` instead (the table is then not printed). Nothing here decides anything.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from contextlib import contextmanager

# rich is imported on first use: `--json` runs never draw anything and skip its ~0.1 s import


@functools.cache
def _console(stderr: bool):
    from rich.console import Console

    return Console(stderr=stderr)


def __getattr__(name: str):
    """`err_console` and `out_console`, made when first asked for."""
    if name in ("err_console", "out_console"):
        return _console(name == "err_console")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Counts:
    """Running counts shown beside the bar."""

    def __init__(self):
        self.ok = self.quarantined = self.reused = 0

    def text(self) -> str:
        return f"[green]{self.ok} ok[/] [red]{self.quarantined} quarantined[/] [dim]{self.reused} reused[/]"

    def plain(self) -> str:
        return f"{self.ok} ok, {self.quarantined} quarantined, {self.reused} reused"


@contextmanager
def progress(description: str, total: int | None, enabled: bool = True, counts: bool = True,
             transient: bool | None = None):
    """Yield ``advance(ok: bool, reused: bool)``; the bar shows ok/quarantined/reused counts
    (``counts=False``: only how many). ``total`` None: not known in advance.

    On a terminal: a live bar on stderr (``transient``: removed at the end; default: kept). Into a
    log (CI, nohup, a pipe; rich draws no bar there): a plain line now and then, see `PlainLines`."""
    tally = Counts()
    if not enabled:
        def advance(ok: bool, reused: bool = False) -> None:
            return None

        yield advance
        return
    err_console = _console(True)
    if not err_console.is_terminal:
        lines = PlainLines(description, total, tally if counts else None)

        def advance(ok: bool, reused: bool = False) -> None:
            tally.ok += ok
            tally.quarantined += not ok
            tally.reused += reused
            lines.advance()

        yield advance
        lines.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=err_console, transient=bool(transient),
    )
    with bar:
        task = bar.add_task(description, total=total, counts=tally.text() if counts else "")

        def advance(ok: bool, reused: bool = False) -> None:
            tally.ok += ok
            tally.quarantined += not ok
            tally.reused += reused
            bar.update(task, advance=1, counts=tally.text() if counts else "")

        yield advance


PLAIN_EVERY_S = 10.0  # at least this long between two lines in a log...
PLAIN_STEP = 0.10  # ...and at least this much more of the work done,
PLAIN_SILENT_MAX_S = 60.0  # but never longer than this without a line


class PlainLines:
    """Progress for a log: one plain line (no colours, no carriage returns) every 10 s or every
    10% of the work, whichever is later, and at most a minute apart; then a last line when any
    came before. A CI log of a long run was otherwise silent for many minutes, which looks like
    a hang; a short run prints nothing."""

    def __init__(self, description: str, total: int | None, tally: Counts | None):
        self.description, self.total, self.tally = description, total, tally
        self.start = self.last = time.monotonic()
        self.done = self.last_done = 0
        self.printed = False

    def advance(self) -> None:
        self.done += 1
        now = time.monotonic()
        waited = now - self.last
        stepped = not self.total or self.done - self.last_done >= PLAIN_STEP * self.total
        if waited >= PLAIN_SILENT_MAX_S or (waited >= PLAIN_EVERY_S and stepped):
            self._line(now)

    def finish(self) -> None:
        if self.printed and self.done != self.last_done:
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        elapsed = now - self.start
        parts = [f"{self.done}/{self.total} ({100 * self.done // max(self.total, 1)}%)" if self.total is not None
                 else f"{self.done} done"]
        if self.tally is not None:
            parts.append(self.tally.plain())
        parts.append(f"{duration(elapsed)} elapsed")
        if self.total and 0 < self.done < self.total:
            parts.append(f"about {duration(elapsed * (self.total - self.done) / self.done)} left")
        sys.stderr.write(f"{self.description}: {', '.join(parts)}\n")
        sys.stderr.flush()
        self.last, self.last_done, self.printed = now, self.done, True


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``: short enough for a log line."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def print_json(doc) -> None:
    """``doc`` as JSON on stdout; characters a terminal would act on (json.dumps leaves the C1
    controls, bidirectional overrides and the like as they are) as \\u escapes: the same JSON."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c == "\n" else json.dumps(c)[1:-1] for c in text)
    sys.stdout.write(text + "\n")


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value: object) -> str:
    """``value`` as text fit for a terminal: every character that is not printable (ESC and the other
    C0 and C1 controls, bidirectional overrides, line separators, unassigned code points) as its
    Python escape (``\\x1b``, ``\\u202e``), everything else as it is.

    Names come from the data (class folders, labels files, keys, source paths, tensor names in a
    checkpoint) and a name holding ESC would otherwise colour, move, retitle or clear the terminal
    of whoever runs pipe on it, or make one line pass for another. Every printer of names passes
    them through here, the way `pipe check` prints names with ``!r`` (this without the quotes); a
    Rich printer also keeps markup off (``markup=False``, or a ``Text``), since ``[`` in a name is
    not markup either."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or repr(c)[1:-1] for c in text)


def plain(value: object):
    """`shown`, as a Rich ``Text``: printed as it is, never read as markup (table cells, titles)."""
    from rich.text import Text

    return Text(shown(value))


def summary_table(title: str, rows: list[tuple[str, object]]) -> None:
    from rich.table import Table

    table = Table(title=plain(title), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(plain(name), plain(value))
    _console(False).print(table)
