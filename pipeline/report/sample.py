"""Bounded, deterministic choices from a big manifest, made with pyarrow (no Python loop per row).

"A few examples per group" must not depend on the order rows happen to be in, nor cost a pass
in Python over a million rows. The rows chosen are those with the smallest content hash
(sha256, then source): a spread over the whole group that is the same on every rerun.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

import pipeline.formats.manifest  # noqa: F401 - answers pyarrow's "is this pandas?" probe without importing pandas (~2 s)

ORDER = [("sha256", "ascending"), ("source", "ascending")]


def pick(table: pa.Table, mask, k: int) -> list[dict]:
    """Up to ``k`` rows of ``table`` where ``mask`` holds, chosen by content hash, shown by source."""
    part = table.filter(mask) if mask is not None else table
    if part.num_rows > k:
        keys = [(c, o) for c, o in ORDER if c in part.column_names]
        part = part.take(pc.select_k_unstable(part, k, sort_keys=keys))
    rows = part.to_pylist()
    rows.sort(key=lambda r: (r.get("source") or ""))
    return rows


def counts(column) -> dict[str, int]:
    """value -> count, nulls under "" (largest first, then by value, so the order is stable)."""
    vc = pc.value_counts(column).to_pylist()
    out = [("" if x["values"] is None else str(x["values"]), x["counts"]) for x in vc]
    out.sort(key=lambda kv: (-kv[1], kv[0]))
    merged: dict[str, int] = {}
    for k, v in out:
        merged[k] = merged.get(k, 0) + v
    return merged


def equals(table: pa.Table, column: str, value: str):
    """A mask: ``column == value`` (False where the column is missing or null)."""
    if column not in table.column_names:
        return pa.array([False] * table.num_rows)
    return pc.fill_null(pc.equal(table[column], value), False)
