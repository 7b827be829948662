"""The `pipe` command line: thin. Each command turns its options into a typed config and calls
its stage; it imports nothing heavy (no torch) until the command runs, so `pipe --help` is fast.

This module is the entry point and stays light: `main` starts pipe clean's workers before it
imports the command line itself (typer, pydantic: pipeline.cli.commands), so that their
start-up runs beside that import instead of after it. ``app`` (the typer app, for tests and
tools) is pipeline.cli.commands.app, imported when asked for.
"""

from __future__ import annotations

import sys


def __getattr__(name: str):
    """``from pipeline.cli.app import app`` (and the other names of the typer app) without
    importing typer where `main` runs: what it needs, it imports after the warm-up.

    Dunder names are the interpreter's own questions, never the typer app's: ``from
    pipeline.cli.app import main`` (the console script, ``python -m pipeline``) asks for
    ``__path__`` first, and answering it by importing the typer app put ~0.1-0.15 s of typer
    before the workers' fork server was started."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pipeline.cli import commands

    try:
        return getattr(commands, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


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
    """`pipe clean`: start the process its workers fork from now, first thing, so that importing
    their decoders (~0.3 s) runs beside this process's own start-up (importing typer and the
    stage, parsing the command line, discovering the input) instead of after it. Nothing for --help,
    nor for `--executor ray` on the command line: the cluster's workers decode, not this machine's
    (set in the TOML instead, the server starts and idles: ~0.5 s of CPU, nothing worse)."""
    if argv[:1] != ["clean"] or "--help" in argv or "-h" in argv or _asks_for_ray(argv):
        return
    from pipeline.clean import WORKER_MODULES
    from pipeline.core.prestart import warm_up  # not the executor: its imports would delay the server

    warm_up(WORKER_MODULES)


def _asks_for_ray(argv: list[str]) -> bool:
    """Whether the command line says `--executor ray` (either spelling)."""
    return "--executor=ray" in argv or any(a == "--executor" and b == "ray" for a, b in zip(argv, argv[1:]))


def main() -> None:
    _skip_the_last_collection()
    _workers_skip_the_script()
    _warm_up_workers(sys.argv[1:])
    from pipeline.cli.commands import app_for

    try:
        app_for(sys.argv[1:])(prog_name="pipe")
    finally:
        _stop_workers()


def _skip_the_last_collection() -> None:
    """At exit, after every atexit handler (this one is registered first, so it runs last), the
    interpreter's last garbage collection walks every object the command made and imported
    (typer, pydantic, pyarrow, numpy): ~45 ms of every `pipe clean`'s tail on the 2-core VM,
    after the manifest is committed and the report printed (measured: 79 -> 32 ms from the
    report to the exit). The command is over by then and what it wrote is closed (outputs are
    written atomically and renamed), so everything is frozen instead, as Ray's driver does
    (`pipeline.executors.ray`). The modules are still torn down, their objects freed by count."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def _stop_workers() -> None:
    """Reap the fork server `_warm_up_workers` started (if any), so that the time its workers
    spent counts as this command's own (`time pipe clean`, resource usage of children)."""
    if "multiprocessing.forkserver" in sys.modules:
        from pipeline.core.executor import stop_server

        stop_server()
