"""`report.json`: what a clean run did, in counts (by status, reason, kind, encoding, label)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from pipeline import __version__
from pipeline.formats.labels import similar_names_warning
from pipeline.formats.manifest_row import ManifestRow
from pipeline.formats.vocabulary import Status


class ReportBuilder:
    def __init__(self) -> None:
        self.status: Counter[str] = Counter()
        self.reason: Counter[str] = Counter()
        self.kind: Counter[str] = Counter()
        self.encoding: Counter[str] = Counter()
        self.label_kept: Counter[str] = Counter()
        self.total = 0

    def add(self, row: ManifestRow) -> None:
        self.total += 1
        self.status[row.status] += 1
        self.kind[row.kind] += 1
        if row.reason:
            self.reason[row.reason] += 1
        if row.encoding:
            self.encoding[row.encoding] += 1
        if row.status == Status.KEPT:
            self.label_kept[row.label if row.label is not None else ""] += 1

    def add_table(self, rows) -> None:
        """Manifest rows as an Arrow table (`columns.manifest_table`): the counts `add` makes of each."""
        status, label = rows.column("status").to_pylist(), rows.column("label").to_pylist()
        self.total += rows.num_rows
        self.status.update(status)
        self.kind.update(rows.column("kind").to_pylist())
        self.reason.update(x for x in rows.column("reason").to_pylist() if x)
        self.encoding.update(x for x in rows.column("encoding").to_pylist() if x)
        self.label_kept.update("" if lab is None else lab for lab, st in zip(label, status) if st == Status.KEPT)

    def build(self, settings: dict, timings: dict, extra: dict | None = None) -> dict:
        s = lambda c: dict(sorted(c.items()))  # noqa: E731 - sorted for byte-stable output
        return {
            "schema_version": 1,
            "tool": f"pipe {__version__}",
            "files": self.total,
            "by_status": {s.value: self.status.get(s, 0) for s in Status},
            "by_reason": s(self.reason),
            "by_kind": s(self.kind),
            "by_encoding": s(self.encoding),
            "kept_by_label": s(self.label_kept),
            "settings": settings,
            **(extra or {}),
            **({"warnings": [warning]} if (warning := similar_names_warning(self.label_kept)) else {}),
            "timings": timings,
        }


def input_location(input_arg, output_arg) -> dict:
    """report.json's ``input``: INPUT as resolved here (settings.input is the argument as typed,
    relative to wherever pipe clean ran) and relative to CLEAN_DIR, so the raw files can be found
    again from another working folder, or after both folders moved together."""
    from pipeline.storage import open_folder

    inp, out = open_folder(input_arg), open_folder(output_arg)
    rel = None
    if inp.local_path is not None and out.local_path is not None:
        rel = Path(os.path.relpath(inp.identity(), out.local_path.resolve())).as_posix()
    return {"path": inp.identity(), "from_clean_dir": rel}
