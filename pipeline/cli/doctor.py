"""`pipe doctor [--port 29500] [--run-dir DIR] [--json]`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting
from train.doctor import DoctorConfig


@dataclass
class DoctorFlags:
    """What `pipe doctor` reads that is no setting of the checks (not a `[doctor]` key)."""

    json: bool = setting(False, "Print facts and verdicts as JSON (schemas/doctor_report.schema.json).", flags=("--json",),
                         toml=False)


@options.command(DoctorConfig, "doctor", DoctorFlags)
@exits_cleanly
def doctor(ctx: typer.Context, **given: Any) -> None:
    """Check this machine before a long run: versions that must fit together, GPUs and their links,
    backends, shared memory, CPUs, the rendezvous port, disk space.

    One line per finding with a verdict (ok / warn / fail) and what to do. Exit 1 when anything
    fails, else 0.
    """
    from pipeline.core import settings, ui
    from train import doctor as dr

    cfg = options.read(ctx, DoctorConfig, "doctor", given)
    settings.check(cfg)  # --port's range
    facts = dr.gather(cfg.port, cfg.run_dir)
    lines = dr.diagnose(facts)
    if given["json"]:
        ui.print_json(dr.to_dict(facts, lines))
    else:
        _table(lines)
    raise typer.Exit(dr.exit_code(lines))


_SHOW = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def _table(lines) -> None:
    from rich.markup import escape
    from rich.table import Table

    from pipeline.core.ui import out_console

    table = Table(title="pipe doctor", title_justify="left")
    table.add_column("check", style="bold")
    table.add_column("verdict")
    table.add_column("found", overflow="fold")
    table.add_column("what to do", overflow="fold")
    for ln in lines:
        table.add_row(ln.name, _SHOW[ln.verdict], escape(ln.value), escape(ln.advice))
    out_console.print(table)
