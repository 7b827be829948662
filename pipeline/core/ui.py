"""What people see: a progress bar on stderr while work runs, a summary table at the end.

Machines get `--json` instead (the table is then not printed). Nothing here decides anything.
"""

from __future__ import annotations

import functools
import json
import sys
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


@contextmanager
def progress(description: str, total: int, enabled: bool = True):
    """Yield ``advance(ok: bool, reused: bool)``; the bar shows ok/quarantined/reused counts."""
    counts = Counts()
    if not enabled:
        def advance(ok: bool, reused: bool = False) -> None:
            return None

        yield advance
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    err_console = _console(True)
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=err_console, transient=not err_console.is_terminal,
    )
    with bar:
        task = bar.add_task(description, total=total, counts=counts.text())

        def advance(ok: bool, reused: bool = False) -> None:
            counts.ok += ok
            counts.quarantined += not ok
            counts.reused += reused
            bar.update(task, advance=1, counts=counts.text())

        yield advance


def print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def summary_table(title: str, rows: list[tuple[str, object]]) -> None:
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows:
        table.add_row(name, str(value))
    _console(False).print(table)
