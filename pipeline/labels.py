"""Read a labels file (`--labels labels.csv|jsonl`, columns ``path,label[,text]``).

(First version: UTF-8 CSV/JSONL. See ARCHITECTURE.md for the full contract.)
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pipeline.errors import UsageError


def load_labels(path: Path, input_root: Path) -> tuple[dict[str, str], dict, set[str]]:
    """Return (relative path -> label, notes for report.json, files to leave out of discovery)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"labels file {path} is not UTF-8") from None
    rows = _rows(text, path)
    labels = {r["path"].replace("\\", "/").lstrip("./"): str(r["label"]) for r in rows}
    exclude = set()
    try:
        exclude.add(path.resolve().relative_to(input_root.resolve()).as_posix())
    except ValueError:
        pass
    return labels, {"file": str(path), "rows": len(rows)}, exclude


def _rows(text: str, path: Path) -> list[dict]:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise UsageError(f"labels file {path} is not valid JSON lines: {e}") from None
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"path", "label"} <= set(reader.fieldnames):
        raise UsageError(f"labels file {path} needs the columns path,label[,text]")
    return list(reader)
