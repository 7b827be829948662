"""Typed configuration with one precedence rule: command line > TOML file (`--config`) > defaults.

Each stage declares a dataclass whose fields are its settings, with a docstring per field. The
TOML file holds one table per command (``[clean]``, ``[shard]``, ``[train]``, ...), keys named
like the flags with underscores; it is validated against ``schemas/config.schema.json``, so an
unknown key or a wrong type is a usage error rather than a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from pipeline.core.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {path} is not valid TOML: {e}") from None


def load_section(path: Path | None, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a config file, schema-checked; {} when no file is given."""
    if path is None:
        return {}
    from pipeline.core.schemas import validate_or_usage_error

    data = load_toml(path)
    validate_or_usage_error(data, "config", what=f"config file {path}")
    return dict(data.get(section, {}))


def resolve(cls, cli_values: dict[str, Any], explicit: set[str], file_values: dict[str, Any]):
    """Build ``cls`` from defaults, then the file's values, then the flags the user typed.

    ``explicit`` names the CLI parameters the user actually gave (not their defaults).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for k, v in file_values.items():
        if k in fields:
            values[k] = Path(v) if isinstance(v, str) and "Path" in str(fields[k].type) else v
    for k, v in cli_values.items():
        if k in fields and (k in explicit or k not in values):
            values[k] = v
    return cls(**values)


def explicit_params(ctx) -> set[str]:
    """Names of the parameters given on the command line (or by environment), not defaulted."""
    given = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may vendor click or not
    return {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "") in given}
