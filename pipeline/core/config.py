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
            values[k] = _typed(fields[k], v)
    for k, v in cli_values.items():
        if k in fields and (k in explicit or k not in values):
            values[k] = v
    return cls(**values)


def _typed(f: dataclasses.Field, v: Any) -> Any:
    """A TOML value as its field holds it: a folder (`pipeline.storage.location`: a URL stays
    text, a Path would fold its "//") or a path."""
    kind = str(f.type)
    if isinstance(v, str) and "Location" in kind:
        from pipeline.storage import location

        return location(v)
    if isinstance(v, str) and "Path" in kind:
        return Path(v)
    return v


def explicit_params(ctx) -> set[str]:
    """Names of the parameters given on the command line (or by environment), not defaulted."""
    given = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}  # by name: typer may vendor click or not
    return {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "") in given}


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_byte_size(value: int | str, flag: str) -> int:
    """A byte count as a number or with a unit: ``16MiB``, ``200MB``, ``1.5GB``, ``500k``.

    kB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024, as disk and file-manager sizes are told.
    Anything else is a usage error that names ``flag``."""
    import re

    if isinstance(value, bool):
        raise UsageError(f"{flag} must be a byte count such as 16MiB or 200MB, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise UsageError(f"{flag} must be a byte count such as 16MiB or 200MB, got {value!r}")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n < 1:
        raise UsageError(f"{flag} must be at least 1 byte, got {value!r}")
    return n
