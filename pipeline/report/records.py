"""Every record the page shows is checked against its schema first.

The folders a report reads may come from anyone: a manifest whose ``width`` is a ``<meta>`` tag,
an index.json whose count is a string, a metrics.jsonl line whose epoch is text. Escaping keeps
markup out of the page; checking each record against its schema (``schemas/``) before anything
of it is rendered keeps the rest honest: a record that breaks it is named on the page with what
is wrong, and none of its values is drawn, counted or used to find a file.

Validation is fastjsonschema's compiled filter, with jsonschema (the reference) wording the
errors of the records it rejects, as `pipe check` does (`pipeline.check.validate`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pipeline.core import schemas

MAX_MESSAGE = 200  # a message quotes the bad value: a 200,000-entry list must not become the page
MAX_LISTED = 5  # records of a file named one by one; the rest are counted
# a folder's own file that is a link out of it is not read: it would put another folder's data in the page
OUTSIDE = "{} is not a file inside the folder (a link out of it?): not read"


@cache
def _schema(name: str, partial: bool) -> dict[str, Any]:
    """Schema ``name``; ``partial``: without its top-level ``required`` (rows read with only the
    columns the page needs: what is there must be right, what was not read is not missing)."""
    schema = dict(schemas.load_schema(name))
    if partial:
        schema.pop("required", None)
    return schema


@cache
def _fast(name: str, partial: bool):
    import fastjsonschema

    return fastjsonschema.compile(_schema(name, partial))


@cache
def _reference(name: str, partial: bool):
    import jsonschema

    schema = _schema(name, partial)
    return jsonschema.validators.validator_for(schema)(schema)


def errors(doc: Any, name: str, partial: bool = False) -> list[str]:
    """What is wrong with ``doc`` by ``schemas/<name>.schema.json``: the first violation as a
    short "where: what" line (empty: nothing). Only the first: wording more would walk the rest
    of the document, and a hostile one holds lists of millions (jsonschema takes seconds a million)."""
    import fastjsonschema

    try:
        _fast(name, partial)(doc)
        return []
    except fastjsonschema.JsonSchemaException:
        pass
    except (TypeError, ValueError, RecursionError):  # a value the compiled filter cannot even compare
        pass
    first = next(iter(_reference(name, partial).iter_errors(doc)), None)
    if first is None:  # the filter and the reference disagree (a test keeps them in step)
        return ["does not match its schema"]
    where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
    return [_cut(f"{where}: {first.message}")]


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"


class Tally:
    """The records of one file that broke its schema: the first few named, all of them counted."""

    def __init__(self, what: str, schema: str):
        self.what, self.schema = what, schema
        self.listed: list[str] = []
        self.count = 0

    def add(self, where: str, problems: list[str]) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(f"{self.what} {where} breaks schemas/{self.schema}.schema.json ({problems[0]}): left out")

    def lines(self) -> list[str]:
        more = self.count - len(self.listed)
        return self.listed + ([f"… and {more:,} more records of {self.what} that break its schema, left out"] if more > 0 else [])
