"""The `pipe` command line: thin. Each command turns its options into a typed config and calls
its stage; it imports nothing heavy (no torch) until the command runs, so `pipe --help` is fast.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

from pipeline import __version__

if TYPE_CHECKING:
    # The same click exceptions module either way; mypy checks against the installed typer,
    # which vendors click (click itself is not installed beside it).
    from typer._click import exceptions as _cx
else:
    try:
        from typer._click import exceptions as _cx  # typer vendors click since 0.2x
    except ImportError:  # pragma: no cover - older typer depends on click itself
        from click import exceptions as _cx


class PipeGroup(TyperGroup):
    """Usage errors as one line on stderr (exit 2), not a traceback or a boxed usage screen."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _cx.ClickException as e:  # UsageError, BadParameter, NoSuchOption
            if type(e).__name__ == "NoArgsIsHelpError":
                e.show()
                sys.exit(0)
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else "pipe: "
            sys.stderr.write(f"{where}error: {e.format_message()}\n")
            sys.exit(e.exit_code)
        except typer.Abort:
            sys.stderr.write("pipe: aborted\n")
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def _new_app() -> typer.Typer:
    return typer.Typer(
        cls=PipeGroup,
        help="From a messy folder of images and text to a fine-tuned model: clean -> shard -> check -> train.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


app = _new_app()


def _version(value: bool) -> None:
    if value:
        print(f"pipe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")):
    """From a messy folder of images and text to a fine-tuned model: clean -> shard -> check -> train."""


COMMANDS = ("clean", "shard", "check", "report", "train", "labels", "doctor")


def _register(target: typer.Typer, names=COMMANDS) -> typer.Typer:
    from pipeline.cli import check, clean, doctor, report, shard
    from train import command as train_command
    from train import labels_command

    functions = {"clean": clean.clean, "shard": shard.shard, "check": check.check, "report": report.report,
                 "train": train_command.train, "labels": labels_command.labels, "doctor": doctor.doctor}
    for name in names:
        target.command(name)(functions[name])
    return target


_register(app)


def _app_for(argv: list[str]) -> typer.Typer:
    """The app that runs ``argv``: for a command, one that holds that command alone. typer
    builds the parameters of every command an app holds on each call (~50 ms for the seven),
    and `pipe clean` needs only its own on the way to its first file. Help, --version and
    anything unknown get the whole app."""
    if not argv or argv[0] not in COMMANDS:
        return app
    one = _new_app()
    one.callback()(_root)
    return _register(one, (argv[0],))


def _workers_skip_the_script() -> None:
    """A spawned worker process first re-runs the main script, unless it is a package's
    __main__: for the `pipe` console script that means importing this CLI (typer, rich) in every
    worker, ~0.1-0.2 s each before its first file. Our workers only ever run pipeline functions,
    so present the script as what it stands for, `python -m pipeline`."""
    script = sys.modules.get("__main__")
    if script is not None and getattr(script, "__spec__", None) is None:
        import importlib.util

        script.__spec__ = importlib.util.find_spec("pipeline.__main__")


def _warm_up_workers(argv: list[str]) -> None:
    """`pipe clean`: start the process its workers fork from now, so that importing their
    decoders (~0.3 s) runs beside this process's own start-up (parsing the command line,
    importing the stage, discovering the input) instead of after it. Nothing for --help."""
    if argv[:1] != ["clean"] or "--help" in argv or "-h" in argv:
        return
    from pipeline.clean.process import WORKER_MODULES
    from pipeline.core.executor import warm_up

    warm_up(WORKER_MODULES)


def main() -> None:
    _workers_skip_the_script()
    _warm_up_workers(sys.argv[1:])
    try:
        _app_for(sys.argv[1:])(prog_name="pipe")
    finally:
        _stop_workers()


def _stop_workers() -> None:
    """Reap the fork server `_warm_up_workers` started (if any), so that the time its workers
    spent counts as this command's own (`time pipe clean`, resource usage of children)."""
    if "multiprocessing.forkserver" in sys.modules:
        from pipeline.core.executor import stop_server

        stop_server()
