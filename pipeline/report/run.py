"""Facts about a RUN_DIR for the page: metrics.jsonl as written by train/components/monitor.py
(``train`` windows with per-rank loss and data-wait share, ``val`` rows, with zero-shot accuracy
and recall for --objective contrastive, ``drift`` warnings), and the label-issue candidates (or,
for a contrastive run, the mismatched image-caption pairs) when `pipe labels` left
``label_issues.parquet`` there.

Both are read as hostile: each line and row is checked against its schema
(``schemas/metrics_row.schema.json``, ``schemas/label_issue_row.schema.json``) and one that breaks
it is named and left out. What is kept is bounded whatever the file holds: metrics.jsonl is read
a line at a time and thinned as it goes (`Thinner`), lines past `MAX_LINE` are skipped, and the
charts show a few ranks of many (`pick_ranks`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.report import records
from pipeline.storage import Folder, Location, open_folder

if TYPE_CHECKING:
    from pipeline.report.clean import Item

MAX_POINTS = 200  # points per chart (and rows per table): a long run is thinned evenly
MAX_DRIFT = 50
MAX_SERIES = 8  # lines per chart: the global one and the ranks that stand out, of however many
MAX_LINE = 16 * 2**20  # a longer line of metrics.jsonl is not one pipe train wrote
LABEL_ISSUES = 50
LABEL_ISSUE_COLUMNS = ["rank", "key", "source", "split", "given", "suggested", "score"]
UNDRAWN = ("memory_mb_per_rank", "input_mean_per_rank", "input_std_per_rank", "_line")


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
    previews: dict[str, Item] = field(default_factory=dict)  # label-issue key -> its image, from a clean dir given
    previews_from: int = 0  # clean dirs the previews were looked for in


class Thinner:
    """At most about ``2 n`` rows of a stream of any length, evenly spaced (every ``stride``-th,
    the stride doubling as rows come), and the last: `thin` then makes them ``n``. Only the rows
    kept are checked (``check``: the row to keep, or None when it breaks its schema); the same
    rows on every read of the same file."""

    def __init__(self, n: int):
        self.n, self.stride, self.seen = n, 1, 0
        self.rows: list[dict] = []
        self.last: tuple[int, dict] | None = None  # the last row offered, taken (if it passes) at the end

    def offer(self, row: dict, check) -> None:
        if self.seen % self.stride == 0:
            self.last = None
            kept = check(row)
            if kept is not None:
                self.rows.append(kept)
                if len(self.rows) > 2 * self.n:
                    self.rows, self.stride = self.rows[::2], self.stride * 2
        else:
            self.last = (self.seen, row)
        self.seen += 1

    def result(self, check) -> list[dict]:
        last = check(self.last[1]) if self.last is not None else None
        return thin(self.rows + ([last] if last is not None else []), self.n)


def gather(where: Location | Folder) -> RunFacts:
    root = open_folder(where)
    f = RunFacts(root.url)
    _read(root, f)
    f.ranks = max((len(r.get("loss_per_rank") or []) for r in f.train), default=0)
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


def _read(root: Folder, f: RunFacts) -> None:
    """metrics.jsonl a line at a time: the rows of each kind thinned, each row kept checked."""
    kinds = {"train": Thinner(MAX_POINTS), "val": Thinner(MAX_POINTS)}
    bad = records.Tally("metrics.jsonl", "metrics_row")
    where = {"n": 0}

    def check(row: dict) -> dict | None:
        wrong = records.errors(row, "metrics_row")
        if wrong:
            bad.add(f"line {row.get('_line', where['n']):,}", wrong)
            return None
        return _compact(row)

    try:
        if not root.contained("metrics.jsonl"):
            f.problems.append(records.OUTSIDE.format("metrics.jsonl"))
            return
        with root.open("metrics.jsonl") as stream:
            for n, line in enumerate(_lines(stream), 1):
                where["n"] = n
                row = _parse(n, line, bad)
                if row is None:
                    continue
                kind = row.get("kind")
                if kind == "drift":  # few: each one checked, the first ones kept
                    if check(row) is not None:
                        f.drift_total += 1
                        if len(f.drift) < MAX_DRIFT:
                            f.drift.append(row)
                elif isinstance(kind, str) and kind in kinds:
                    row["_line"] = n
                    kinds[kind].offer(row, check)
    except (OSError, UsageError, StageFailed) as e:
        f.problems.append(f"metrics.jsonl is not readable: {e}")
    f.windows = kinds["train"].seen
    f.train, f.val = kinds["train"].result(check), kinds["val"].result(check)
    f.problems += bad.lines()


def _parse(n: int, line: bytes | None, bad: records.Tally) -> dict | None:
    """One line as a JSON object (None: blank, or named in ``bad``)."""
    if line is None:
        bad.add(f"line {n:,}", [f"longer than {MAX_LINE:,} bytes"])
        return None
    if not line.strip():
        return None
    try:
        row = json.loads(line.decode("utf-8", errors="surrogateescape"))
    except (ValueError, RecursionError):
        bad.add(f"line {n:,}", ["not JSON"])
        return None
    if not isinstance(row, dict):
        bad.add(f"line {n:,}", ["not a JSON object"])
        return None
    return row


def _compact(row: dict) -> dict:
    """The row without the per-rank lists the page does not draw (memory, input statistics: with
    many ranks they are most of a row), nor our line number."""
    return {k: v for k, v in row.items() if k not in UNDRAWN}


def _lines(stream) -> Any:
    """The lines of a binary stream, each at most `MAX_LINE` bytes (a longer one is None), split
    as a text file splits them (\\n, \\r\\n or \\r)."""
    buf, skipping = b"", False
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            break
        buf += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *whole, buf = buf.split(b"\n")
        for line in whole:
            if skipping:
                skipping = False
                continue
            yield None if len(line) > MAX_LINE else line
        if len(buf) > MAX_LINE:
            if not skipping:
                yield None
            buf, skipping = b"", True
    if buf and not skipping:
        yield buf


def thin(rows: list[dict], n: int = MAX_POINTS) -> list[dict]:
    """At most ``n`` rows, evenly spaced, always keeping the first and the last."""
    if len(rows) <= n:
        return rows
    step = (len(rows) - 1) / (n - 1)
    return [rows[round(i * step)] for i in range(n)]


def pick_ranks(rows: list[dict], key: str, reference: str | None, k: int) -> list[int]:
    """The ``k`` ranks to draw of however many (all when there are few): those furthest from
    ``reference`` on average (the global value), or with the highest values without one."""
    import numpy as np

    ranks = max((len(r.get(key) or []) for r in rows), default=0)
    if ranks <= k:
        return list(range(ranks))
    values = np.full((len(rows), ranks), np.nan)
    ref = np.zeros(len(rows))
    for i, r in enumerate(rows):
        got = r.get(key) or []
        values[i, : len(got)] = got  # numbers: the rows kept passed the schema
        if reference:
            ref[i] = r[reference] if _finite(r.get(reference)) else np.nan
    with np.errstate(invalid="ignore"):
        gap = np.abs(values - ref[:, None]) if reference else values
    score = np.where(np.isfinite(gap), gap, 0.0).sum(axis=0)
    top = sorted(range(ranks), key=lambda i: (-score[i], i))[:k]
    return sorted(top)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _label_issues(f: RunFacts, root: Folder) -> None:
    """`pipe labels` writes this file; each row shown is checked against its schema first."""
    try:
        if not root.exists("label_issues.parquet"):
            return
    except (UsageError, StageFailed, OSError):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(pa.BufferReader(root.read_contained("label_issues.parquet"))) as pf:
            names = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in LABEL_ISSUE_COLUMNS if c in names])
            f.label_issues_total = table.num_rows
            if "rank" in table.column_names:
                table = table.sort_by([("rank", "ascending")])
            rows = table.slice(0, LABEL_ISSUES).to_pylist()
    except PermissionError:
        f.problems.append(records.OUTSIDE.format("label_issues.parquet"))
        return
    except (OSError, pa.ArrowException) as e:
        f.problems.append(f"label_issues.parquet is not readable: {e}")
        return
    bad = records.Tally("label_issues.parquet", "label_issue_row")
    f.label_issues = []
    for i, row in enumerate(rows):
        wrong = records.errors(row, "label_issue_row")
        if wrong:
            bad.add(f"row {i + 1:,}", wrong)
        else:
            f.label_issues.append(row)
    f.problems += bad.lines()
