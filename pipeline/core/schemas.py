"""Load the JSON Schemas in ``schemas/`` and validate documents against them.

Schema files are named ``<name>.schema.json``. Stages validate what they write in their tests;
``pipe check`` and config loading validate what they read.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import UsageError

if TYPE_CHECKING:
    from importlib.abc import Traversable


def _schema_dir() -> Traversable:
    """The schemas next to the code that runs.

    An installed wheel carries them as ``pipeline/schemas`` (setup.py maps the top-level folder
    there). A checkout (an editable install, or tests with the repo first on sys.path) has them
    only at the top level, where the design card keeps them: setuptools' editable finder cannot
    import a folder without ``__init__.py`` that lives outside ``pipeline/``, so the packaged
    name does not resolve there. Asking ``pipeline`` itself, rather than importing
    ``pipeline.schemas``, also means a checkout never reads another checkout's schemas through a
    venv whose editable install points elsewhere.
    """
    packaged = resources.files("pipeline") / "schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "schemas"


SCHEMA_DIR = _schema_dir()


@cache
def load_schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


@cache
def _validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def errors(doc: Any, name: str) -> list[str]:
    """Every violation of schema ``name`` in ``doc``, as ``path: message`` lines (empty = valid)."""
    out = []
    for err in sorted(_validator(name).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        out.append(f"{where}: {err.message}")
    return out


def validate_or_usage_error(doc: Any, name: str, what: str) -> None:
    errs = errors(doc, name)
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise UsageError(f"{what} does not match schemas/{name}.schema.json: {errs[0]}{more}")
