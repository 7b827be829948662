"""A command's typer parameters, made from the settings its Config declares (`pipeline.core.settings`).

A command is written ``def clean(ctx, **given)``; `command` gives it the signature typer reads
(`inspect.signature` honours ``__signature__``): the Config's settings that have a flag, then the
command's own flags (``--json``...: a small dataclass declared the same way, never a TOML key),
then ``--config FILE`` when the command has a `[table]`. The body calls `read`, which applies the
one precedence rule (command line > TOML > defaults, `pipeline.core.config.resolve`).

Only the invoked command's parameters are built on the way to its work (`commands.app_for`):
building them costs microseconds per setting, importing the Config a light module.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.common import folder_arg
from pipeline.core.settings import MISSING, Declared, Setting, declared

# rich.markup.escape's pattern, without importing rich on the way to a command's first file
_MARKUP = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def command(config: type, table: str | None, flags: type | None = None, panels: tuple[str, ...] = ()):
    """Give a command function ``fn(ctx, **given)`` the typer parameters of ``config``'s settings
    (those with a flag), ``flags``' settings, and ``--config FILE`` for ``table``; ``panels`` orders
    the `--help` panels (a panel not named there comes after them)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        every = [d for d in declared(config) if d.setting.cli]
        if flags is not None:
            every += declared(flags)
        if table is not None:
            every.append(config_option(table))
        order = {name: i for i, name in enumerate(panels)}
        every.sort(key=lambda d: (d.setting.panel is not None, order.get(d.setting.panel or "", len(order))))
        ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        fn.__signature__ = inspect.Signature([ctx, *map(parameter, every)])  # type: ignore[attr-defined]
        fn.config, fn.flags, fn.table = config, flags, table  # type: ignore[attr-defined]
        return fn

    return decorate


def config_option(table: str) -> Declared:
    """``--config FILE``: every command with a `[table]` has it, said the same way."""
    return Declared("config", Path | None, None, Setting(f"TOML file whose [{table}] table sets any of these flags.", toml=False))


def parameter(d: Declared) -> inspect.Parameter:
    """One setting as typer's ``name: Annotated[type, typer.Option(...)] = default``."""
    s = d.setting
    text = _escape(s.help)
    if s.argument:
        info: Any = typer.Argument(help=text, show_default=False, hidden=s.hidden)
    else:
        info = typer.Option(*s.flags, help=text, show_default=not s.required, hidden=s.hidden, rich_help_panel=s.panel)
    default = inspect.Parameter.empty if s.required or d.default is MISSING else d.default
    return inspect.Parameter(d.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[_cli_type(d), info])


def _cli_type(d: Declared) -> Any:
    """What typer reads the value as: a folder that may be in object storage as text (`folder_arg` makes it a
    Path or keeps the URL); a value of several types (a byte count as 16MiB or 1000) as text too,
    which the setting's own parser reads; else the field's type."""
    if d.setting.remote:
        if typing.get_origin(d.value_type) in (list, tuple):  # several folders (a repeatable option; None when none given)
            return list[str] if d.value_type is d.type else list[str] | None
        return str | None if d.default is None else str
    members = [a for a in typing.get_args(d.type) if a is not type(None)]
    if typing.get_origin(d.type) in (typing.Union, types.UnionType) and len(members) > 1:
        return str
    return d.type


def _escape(text: str) -> str:
    """Help in rich's markup, where "[clean]" (or "pipe-ml[ray]") would be read as a tag and dropped."""
    from typer import core

    return _MARKUP.sub(r"\1\1\\\2", text) if core.DEFAULT_MARKUP_MODE == "rich" else text


def read(ctx: typer.Context, config: type, table: str | None, given: dict[str, Any]) -> Any:
    """``config`` from the command line's ``given`` values, the TOML file's `[table]` (``--config``)
    and the defaults, in that precedence."""
    from pipeline.core.config import explicit_params, load_section, resolve

    values = {d.name: _folder(d, given[d.name]) for d in declared(config) if d.name in given}
    file_values = load_section(given.get("config"), table) if table is not None else {}
    return resolve(config, values, explicit_params(ctx), file_values)


def _folder(d: Declared, value: Any) -> Any:
    if not d.setting.remote or value is None:
        return value
    return [folder_arg(v) for v in value] if isinstance(value, list) else folder_arg(value)

