"""`pipe doctor [--port 29500] [--run-dir DIR] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly


@exits_cleanly
def doctor(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Rendezvous port the run will use (torchrun --master-port).")] = 29500,
    run_dir: Annotated[Path, typer.Option(help="Where the run will write checkpoints and logs (free space, writable).")] = Path("."),
    json: Annotated[bool, typer.Option("--json", help="Print facts and verdicts as JSON (schemas/doctor_report.schema.json).")] = False,
    config: Annotated[Path | None, typer.Option(help="TOML file whose \\[doctor] table sets --port and --run-dir.")] = None,
) -> None:
    """Check this machine before a long run: versions that must fit together, GPUs and their links,
    backends, shared memory, CPUs, the rendezvous port, disk space.

    One line per finding with a verdict (ok / warn / fail) and what to do. Exit 1 when anything
    fails, else 0.
    """
    from pipeline.core import ui
    from pipeline.core.config import explicit_params, load_section, resolve
    from pipeline.core.errors import UsageError
    from train import doctor as dr

    cfg = resolve(dr.DoctorConfig, {"port": port, "run_dir": run_dir}, explicit_params(ctx), load_section(config, "doctor"))
    if not 1 <= cfg.port <= 65535:
        raise UsageError(f"--port must be between 1 and 65535, got {cfg.port}")
    facts = dr.gather(cfg.port, cfg.run_dir)
    lines = dr.diagnose(facts)
    if json:
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
