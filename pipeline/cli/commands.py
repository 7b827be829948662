"""The `pipe` commands as a typer app: imported once `pipe` knows what it runs (see
pipeline.cli.app.main, which starts pipe clean's workers first).
"""

from __future__ import annotations

import re
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

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, windows_expand_args=True,
             **extra):
        for command in (self, *self.commands.values()):
            _coerce_plain_values_directly(command)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False,
                              windows_expand_args=windows_expand_args, **extra)
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


# A decimal number as a command line gives it: what int() and float() read exactly as pydantic does
_INT = re.compile(r"-?(0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")


class _PlainValues:
    """A parameter's coercion where the value is absent, already what it should be (a default)
    or a plain decimal number: typer 0.29 coerces every value, defaults and absent ones included,
    through a pydantic TypeAdapter, and importing pydantic and building those adapters was ~0.2 s
    of `pipe clean`'s way to its first file. Any other value goes through typer's own coercion
    (``typer_coercion``), so what is accepted, what it becomes and every error message stay typer's."""

    def __init__(self, plain: type | None, typer_coercion):
        self.plain, self.typer_coercion = plain, typer_coercion  # plain: int, float, str or None

    def coerce(self, value, param, ctx):
        if value is None:
            return None  # what typer's coercion gives an absent single value, whatever its type
        kind = type(value)
        if kind is self.plain:
            return value
        if kind is str and self.plain is int and _INT.fullmatch(value):
            return int(value)
        if kind is str and self.plain is float and _FLOAT.fullmatch(value):
            return float(value)
        return self.typer_coercion(param.type_descriptor).coerce(value, param=param, ctx=ctx)


def _coerce_plain_values_directly(command) -> None:
    """`_plain_values` for each of ``command``'s parameters, its help option included (which
    click makes when it first parses)."""
    for param in command.params:
        _plain_values(param)
    made = command.get_help_option
    if getattr(made, "plain_values", False):
        return  # done when this command ran before

    def get_help_option(ctx):
        option = made(ctx)
        if option is not None:
            _plain_values(option)
        return option

    get_help_option.plain_values = True  # type: ignore[attr-defined]
    command.get_help_option = get_help_option


def _plain_values(param) -> None:
    """Give a single-valued parameter `_PlainValues` (the shortcuts for an int, float or str
    without a range or choices); others, or a typer without the internals this relies on, keep
    typer's coercion untouched."""
    try:
        from typer._coercion import build_runtime_param
    except ImportError:  # pragma: no cover - another typer: its own coercion throughout
        return
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(param, "_runtime_param", "absent") is not None or param.multiple or param.nargs != 1:
        return
    plain = desc.annotation in (int, float, str) and not (desc.is_choice or desc.is_ranged or desc.is_file or desc.is_path
                                                         or desc.parameter_info.parser is not None)
    param._runtime_param = _PlainValues(desc.annotation if plain else None, build_runtime_param)


def _new_app() -> typer.Typer:
    return typer.Typer(
        cls=PipeGroup,
        help="From a messy folder of images and text to a fine-tuned model: clean -> shard -> check -> train.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _version(value: bool) -> None:
    if value:
        print(f"pipe {__version__}")
        raise typer.Exit()


def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")):
    """From a messy folder of images and text to a fine-tuned model: clean -> shard -> check -> train."""


COMMANDS = ("clean", "shard", "check", "report", "train", "eval", "labels", "export", "doctor")
MODULES = {"clean": "pipeline.cli.clean", "shard": "pipeline.cli.shard", "check": "pipeline.cli.check",
           "report": "pipeline.cli.report", "train": "train.command", "eval": "train.eval_command",
           "labels": "train.labels_command", "export": "train.export_command", "doctor": "pipeline.cli.doctor"}


def functions(names=COMMANDS) -> dict:
    """Each command's function (its typer signature made from its declared settings), by name;
    only the modules of ``names`` are imported."""
    import importlib

    return {name: getattr(importlib.import_module(MODULES[name]), name) for name in names}


def _app(names=COMMANDS) -> typer.Typer:
    made = _new_app()
    made.callback()(_root)
    for name, fn in functions(names).items():
        made.command(name)(fn)
    return made


def __getattr__(name: str) -> typer.Typer:
    """``app``, the whole command line, made when first asked for (tests, tools, `pipe --help`):
    a command run through `app_for` imports its own module and Config only."""
    if name == "app":
        globals()["app"] = made = _app()
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_for(argv: list[str]) -> typer.Typer:
    """The app that runs ``argv``: for a command, one that holds that command alone. typer
    builds the parameters of every command an app holds on each call (~50 ms for the seven),
    and `pipe clean` needs only its own on the way to its first file (nor the other commands'
    modules and Configs imported). Help, --version and anything unknown get the whole app."""
    if not argv or argv[0] not in COMMANDS:
        return globals().get("app") or __getattr__("app")
    return _app((argv[0],))
