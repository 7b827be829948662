"""``schemas/config.schema.json``, generated from the commands' declared settings.

The file stays committed (other tools read ``schemas/``, and `--config` files are validated
against it where pipe is installed); tests/pipeline/cli/test_config_schema.py fails when it differs
from what the declarations generate. After changing a setting, write it again:

    python -m pipeline.cli.config_schema --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipeline.core.settings import json_schema

HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://pipe.dev/schemas/config.schema.json",
    "title": "pipe config file (--config)",
    "description": "A TOML file with one table per command. Keys are the command's flags with underscores "
                   "(--resize-mode -> resize_mode). Precedence: a flag typed on the command line > this file > the "
                   "built-in default. Unknown keys are errors, so a typo cannot silently disable a setting.",
}


def document() -> dict[str, Any]:
    """The schema: a closed table per command that has one, in the order `pipe --help` lists them."""
    from pipeline.cli.commands import COMMANDS, functions

    tables = {}
    for name in COMMANDS:
        fn = functions()[name]
        if getattr(fn, "table", None) is not None:
            tables[fn.table] = json_schema(fn.config)
    return {**HEADER, "type": "object", "additionalProperties": False, "properties": tables}


def text() -> str:
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> None:
    if argv == ["--write"]:  # the checkout's schemas/, beside pipeline/
        (Path(__file__).resolve().parents[2] / "schemas" / "config.schema.json").write_text(text(), encoding="utf-8")
    elif argv:
        sys.exit("usage: python -m pipeline.cli.config_schema [--write]")
    else:
        sys.stdout.write(text())


if __name__ == "__main__":
    main(sys.argv[1:])
