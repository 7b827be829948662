"""Facts about a RUN_DIR for the page: metrics.jsonl as written by train/components/monitor.py
(``train`` windows with per-rank loss and data-wait share, ``val`` rows, with zero-shot accuracy
and recall for --objective contrastive, ``drift`` warnings), and the label-issue candidates (or,
for a contrastive run, the mismatched image-caption pairs) when `pipe labels` left
``label_issues.parquet`` there."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

from pipeline.core.errors import StageFailed, UsageError
from pipeline.storage import Folder, Location, open_folder

MAX_POINTS = 200  # points per chart (and rows per table): a long run is thinned evenly
MAX_DRIFT = 50
LABEL_ISSUES = 50
LABEL_ISSUE_COLUMNS = ["rank", "key", "source", "split", "given", "suggested", "score"]


@dataclass
class RunFacts:
    path: str  # the folder as given (a path, or a URL)
    problems: list[str] = field(default_factory=list)
    train: list[dict] = field(default_factory=list)
    val: list[dict] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    drift_total: int = 0
    ranks: int = 0
    windows: int = 0
    label_issues: list[dict] | None = None
    label_issues_total: int = 0
    objective: str = "classify"  # config.json's: a contrastive run's label_issues are mismatched pairs


def gather(where: Location | Folder) -> RunFacts:
    root = open_folder(where)
    f = RunFacts(root.url)
    rows = _read(root, f.problems)
    train = [r for r in rows if r.get("kind") == "train" and isinstance(r.get("step"), (int, float))]
    f.windows = len(train)
    f.train = thin(train)
    f.val = thin([r for r in rows if r.get("kind") == "val" and isinstance(r.get("step"), (int, float))])
    drift = [r for r in rows if r.get("kind") == "drift"]
    f.drift_total, f.drift = len(drift), drift[:MAX_DRIFT]
    f.ranks = max((len(r.get("loss_per_rank") or []) for r in train), default=0)
    _label_issues(f, root)
    f.objective = _objective(root)
    return f


def _objective(root: Folder) -> str:
    """config.json's objective (a contrastive run's label issues are mismatched pairs)."""
    try:
        conf = json.loads(root.read("config.json"))
    except (OSError, ValueError, UsageError, StageFailed):
        return "classify"
    return str(conf.get("objective") or "classify") if isinstance(conf, dict) else "classify"


def _read(root: Folder, problems: list[str]) -> list[dict]:
    rows = []
    try:
        text = root.read("metrics.jsonl").decode("utf-8", errors="surrogateescape")  # bad bytes shown as \xNN
        for n, line in enumerate(io.StringIO(text, newline=None), 1):  # lines as a text file gives them
            try:
                row = json.loads(line)
            except ValueError:
                problems.append(f"metrics.jsonl line {n} is not JSON")
                continue
            if isinstance(row, dict):
                rows.append(row)
    except (OSError, UsageError, StageFailed) as e:
        problems.append(f"metrics.jsonl is not readable: {e}")
    return rows


def thin(rows: list[dict], n: int = MAX_POINTS) -> list[dict]:
    """At most ``n`` rows, evenly spaced, always keeping the first and the last."""
    if len(rows) <= n:
        return rows
    step = (len(rows) - 1) / (n - 1)
    return [rows[round(i * step)] for i in range(n)]


def _label_issues(f: RunFacts, root: Folder) -> None:
    """Part 2 of issue 13 (`pipe labels`) writes this file; until then the section is absent."""
    if not root.exists("label_issues.parquet"):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(pa.BufferReader(root.read("label_issues.parquet"))) as pf:
            names = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in LABEL_ISSUE_COLUMNS if c in names])
    except (OSError, pa.ArrowException) as e:
        f.problems.append(f"label_issues.parquet is not readable: {e}")
        return
    f.label_issues_total = table.num_rows
    if "rank" in table.column_names:
        table = table.sort_by([("rank", "ascending")])
    f.label_issues = table.slice(0, LABEL_ISSUES).to_pylist()
