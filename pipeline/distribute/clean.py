"""`pipe clean --executor ray`, the driver's side: plan parts, reuse the finished ones, run the
rest on the cluster, and hand the stage every file's result in candidate order as `Columns`, as
a local run does. Of each part's results file the driver keeps only the columns decide needs
(~110 B a file); the manifest reads the parts again, one at a time. Ray itself is imported by
`ray_executor` only, when the stage starts (`ray_executor.warmed_up`: the cluster's workers get
ready while the driver discovers and plans)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.core.errors import StageFailed
from pipeline.distribute import parts as partlib
from pipeline.storage.folder import Folder

if TYPE_CHECKING:
    from pipeline.clean.columns import Columns


def process_in_parts(cfg, candidates: Sequence[Candidate], settings,
                     reusable: Callable[[FileResult | None, Candidate], bool],
                     show_progress: bool, clean_dir: Path | Folder) -> tuple[Columns, int, dict]:
    """Every candidate's result in order, how many were reused, and the report's "parts" section.

    ``clean_dir`` is where the tasks write outputs and part results and where the driver reads
    them back: CLEAN_DIR on a file system every node shares, or an object-storage Folder.
    A part is reused when its results file is there and every file in it is unchanged (the same
    test a local resume applies to each journal line); otherwise it runs again, whole."""
    import pyarrow as pa

    from pipeline.clean.columns import DECIDE, iter_results
    from pipeline.core.ui import progress

    t0 = time.perf_counter()
    plan = partlib.plan(candidates, cfg.fingerprint(), cfg.part_files)
    partlib.sweep(clean_dir, plan)
    found: dict[int, pa.Table] = {}
    for p in plan:
        old = partlib.read_table(clean_dir, p)
        if old is not None and all(reusable(r, c) for r, c in zip(iter_results(old), candidates[p.begin:p.end])):
            found[p.index] = _compact(old.select(DECIDE), candidates[p.begin:p.end])
    todo = [p.index for p in plan if p.index not in found]
    reused_files = sum(len(plan[i]) for i in found)
    runs: list[dict] = []
    with progress(f"clean ({len(plan)} parts on ray)", len(candidates), show_progress) as advance:
        for i in sorted(found):
            for failed in found[i].column("reason").is_valid().to_pylist():
                advance(not failed, True)

        tell = PartsLine(len(todo), len(candidates) - reused_files, show_progress)

        def done(i: int, run) -> None:
            table = gather(clean_dir, plan[i], candidates)
            if table is None:
                raise StageFailed(f"part {plan[i].name} ended without a readable results file in {_where(clean_dir)}")
            found[i] = table
            runs.append(run.as_dict())
            for failed in table.column("reason").is_valid().to_pylist():
                advance(not failed, False)
            tell.part_done(table.num_rows)

        if todo:
            from pipeline.distribute.ray_executor import process_parts

            where = clean_dir.url if isinstance(clean_dir, Folder) else str(clean_dir)
            process_parts(cfg.ray_address, settings, where, plan, candidates, cfg.file_timeout, todo, done, str(cfg.input))
    cols = as_columns(clean_dir, plan, [found.pop(p.index) for p in plan])
    seconds = time.perf_counter() - t0
    redone_files = len(candidates) - reused_files
    report = {"executor": "ray", "parts": len(plan), "part_files": cfg.part_files,
              "reused_parts": len(plan) - len(todo), "redone_parts": len(todo),
              "reused": [plan[i].name for i in sorted(set(range(len(plan))) - set(todo))],
              "files_per_s": round(redone_files / seconds, 2) if seconds > 0 else None,
              "runs": sorted(runs, key=lambda r: r["part"])}
    return cols, reused_files, report


def _where(clean_dir: Path | Folder) -> str:
    """Where part results are, for a message."""
    return f"{clean_dir.url if isinstance(clean_dir, Folder) else clean_dir}/{partlib.PARTS_DIR}"


def gather(out: Path | Folder, part: partlib.Part, candidates: Sequence[Candidate]):
    """What the driver keeps of a finished part: its decide columns (None: no results file)."""
    from pipeline.clean.columns import DECIDE

    table = partlib.read_table(out, part, DECIDE)
    return None if table is None else _compact(table, candidates[part.begin:part.end])


def as_columns(out: Path | Folder, plan: Sequence[partlib.Part], tables: list) -> Columns:
    """Every part's gathered columns (``tables``, in plan order, emptied here) as one `Columns`,
    which reads each part's whole results again, in order, when the manifest is written."""
    import pyarrow as pa

    from pipeline.clean.columns import Columns

    table = pa.concat_tables(tables) if tables else _compact(None, [])
    tables.clear()
    columns = {name: table.column(name) for name in table.column_names}
    del table  # each column is freed once Columns has converted it

    def chunks():
        for p in plan:
            part = partlib.read_table(out, p)
            if part is None:
                raise StageFailed(f"the results file of part {p.name} in {_where(out)} went away during the run")
            yield part

    return Columns(columns, chunks)


def _compact(table, candidates: Sequence[Candidate]):
    """A part's decide columns in buffers of their own (a results file is read whole, and a
    column sliced from it would keep all of it in memory), labelled from the listing: labels are
    not part of a part's work (a labels file may change them)."""
    import pyarrow as pa

    from pipeline.clean.columns import DECIDE, RESULTS

    if table is None:
        return pa.table({n: pa.array([], RESULTS.field(n).type) for n in DECIDE})
    columns = {n: pa.concat_arrays(table.column(n).chunks) for n in DECIDE if n != "label"}
    columns["label"] = pa.array([c.label for c in candidates], pa.string())
    return pa.table({n: columns[n] for n in DECIDE})


class PartsLine:
    """Progress across the cluster, beside the files bar: parts done, files/s, time left; one
    line every 10 s at most (and for the last part), so a million parts do not flood a log."""

    EVERY_S = 10.0

    def __init__(self, parts: int, files: int, enabled: bool):
        self.parts, self.files, self.enabled = parts, files, enabled
        self.start = self.last = time.monotonic()
        self.parts_done = self.files_done = 0

    def part_done(self, files: int) -> None:
        from pipeline.core.ui import duration

        self.parts_done += 1
        self.files_done += files
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.EVERY_S and self.parts_done < self.parts):
            return
        self.last = now
        rate = self.files_done / max(now - self.start, 1e-9)
        left = (self.files - self.files_done) / rate if rate > 0 else 0.0
        sys.stderr.write(f"ray: {self.parts_done}/{self.parts} parts done, {rate:.0f} files/s"
                         f"{f', about {duration(left)} left' if self.parts_done < self.parts else ''}\n")
        sys.stderr.flush()
