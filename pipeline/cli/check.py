"""`pipe check DIR... [--policy policy.toml] [--deep] [--json] [--junit FILE]`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from pipeline.check.config import CheckConfig
from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting


@dataclass
class CheckFlags:
    """What `pipe check` reads that is no setting of the checks (not a `[check]` key)."""

    json: bool = setting(False, "Print the report as JSON (schemas/check_report.schema.json) instead of a table.",
                         flags=("--json",), toml=False)
    junit: Path | None = setting(None, "Also write the report as JUnit XML to this file, one test case per check.",
                                 toml=False)
    html: Path | None = setting(None, "Also write the pipe report page of these folders, with the verdicts on top.",
                                toml=False)


@options.command(CheckConfig, "check", CheckFlags)
@exits_cleanly
def check(ctx: typer.Context, **given: Any) -> None:
    """Hold clean or shard dirs to a quality policy: the CI data-quality gate.

    Exit 0 when every check passed (warnings allowed), 1 when a check whose severity is error
    failed, 2 for a usage error (missing folder, bad policy).
    """
    from pipeline.check import stage
    from pipeline.core import ui

    json, junit, html = given["json"], given["junit"], given["html"]
    cfg = options.read(ctx, CheckConfig, "check", given)
    from pipeline.storage import local_path

    local = [p for p in (local_path(d) for d in [*cfg.dirs, cfg.input] if d is not None) if p is not None]
    if junit is not None:
        _refuse_junit_inside(junit, local)
    if html is not None and any(local_path(d) is None for d in cfg.dirs):
        from pipeline.core.errors import UsageError

        raise UsageError("--html reads the folders' files on this machine: check folders in object storage without it, "
                         "or a local copy with it")
    if html is not None:
        from pipeline.report.stage import refuse_output_inside

        refuse_output_inside(html, local, "--html")
    report = stage.run(cfg, show_progress=not json)
    if junit is not None:
        _write_junit(report, junit)
    if html is not None:
        _write_html(report, html)
    if json:
        ui.print_json(report.to_dict())
    else:
        _table(report)
    raise typer.Exit(report.exit_code)


def _refuse_junit_inside(path: Path, folders: list[Path]) -> None:
    """Before any check runs: --junit must not name a folder, nor a file inside a folder being checked."""
    from pipeline.core.files import refuse_output_inside

    refuse_output_inside(path, folders, "--junit", "XML", "checked")


def _write_junit(report, path: Path) -> None:
    from pipeline.check import junit
    from pipeline.core.errors import UsageError

    try:
        junit.write(report, path)
    except OSError as e:
        raise UsageError(f"cannot write the JUnit file {path}: {e.strerror or e}") from None


def _write_html(report, path: Path) -> None:
    """The same page as `pipe report` of the checked folders, the check's verdicts on top."""
    from pipeline.report import stage as report_stage

    page = report_stage.build([f.path for f in report.folders], check=report.to_dict())
    report_stage.write(page, path)


_SHOW = {("pass", "error"): "[green]ok[/]", ("pass", "warning"): "[green]ok[/]",
         ("fail", "error"): "[bold red]FAIL[/]", ("fail", "warning"): "[yellow]warn[/]",
         ("skip", "error"): "[dim]skip[/]", ("skip", "warning"): "[dim]skip[/]"}


def _table(report) -> None:
    from rich.markup import escape
    from rich.table import Table

    from pipeline.core.ui import out_console, plain, shown

    for folder in report.folders:
        table = Table(title=plain(f"pipe check {folder.path} ({folder.kind} dir{', deep' if report.deep else ''})"),
                      title_justify="left")
        table.add_column("check", style="bold")
        table.add_column("result")
        table.add_column("severity", style="dim")
        table.add_column("finding", overflow="fold")
        for r in folder.results:
            table.add_row(r.name, _SHOW[(r.status, r.severity)], r.severity, escape(shown(r.message)))
        out_console.print(table)
    s = report.summary()
    verdict = "[bold red]FAILED[/]" if report.exit_code else "[bold green]PASSED[/]"
    out_console.print(f"{verdict}: {s['passed']} passed, {s['errors']} failed, {s['warnings']} warnings, "
                      f"{s['skipped']} skipped (exit {report.exit_code})")
