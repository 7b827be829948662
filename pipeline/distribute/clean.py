"""`pipe clean --executor ray`, the driver's side: plan parts, reuse the finished ones, run the
rest on the cluster, and hand the stage every `FileResult` in candidate order, as a local run
would. Ray itself is imported only when some part has to run (`ray_executor`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.core.errors import StageFailed
from pipeline.distribute import parts as partlib
from pipeline.storage.folder import Folder


def process_in_parts(cfg, candidates: Sequence[Candidate], settings,
                     reusable: Callable[[FileResult | None, Candidate], bool],
                     show_progress: bool, clean_dir: Path | Folder) -> tuple[list[FileResult], int, dict]:
    """Every candidate's result in order, how many were reused, and the report's "parts" section.

    ``clean_dir`` is where the tasks write outputs and part results and where the driver reads
    them back: CLEAN_DIR on a file system every node shares, or an object-storage Folder.
    A part is reused when its results file is there and every file in it is unchanged (the same
    test a local resume applies to each journal line); otherwise it runs again, whole."""
    from pipeline.core.ui import progress

    t0 = time.perf_counter()
    plan = partlib.plan(candidates, cfg.fingerprint(), cfg.part_files)
    partlib.sweep(clean_dir, plan)
    found: dict[int, list[FileResult]] = {}
    for p in plan:
        old = partlib.read_results(clean_dir, p)
        if old is not None and all(reusable(r, c) for r, c in zip(old, candidates[p.begin:p.end])):
            found[p.index] = old
    todo = [p.index for p in plan if p.index not in found]
    reused_files = sum(len(plan[i]) for i in found)
    runs: list[dict] = []
    with progress(f"clean ({len(plan)} parts on ray)", len(candidates), show_progress) as advance:
        for i in sorted(found):
            for r in found[i]:
                advance(r.reason is None, True)

        tell = PartsLine(len(todo), len(candidates) - reused_files, show_progress)

        def done(i: int, run) -> None:
            results = partlib.read_results(clean_dir, plan[i])
            if results is None:
                raise StageFailed(f"part {plan[i].name} ended without a readable results file in {clean_dir}/{partlib.PARTS_DIR}")
            found[i] = results
            runs.append(run.as_dict())
            for r in results:
                advance(r.reason is None, False)
            tell.part_done(len(results))

        if todo:
            from pipeline.distribute.ray_executor import process_parts

            where = clean_dir.url if isinstance(clean_dir, Folder) else str(clean_dir)
            process_parts(cfg.ray_address, settings, where, plan, candidates, cfg.file_timeout, todo, done, str(cfg.input))
    results: list[FileResult] = []
    for p in plan:
        for r, c in zip(found[p.index], candidates[p.begin:p.end]):
            r.label = c.label  # labels are not part of a part's work (a labels file may change them)
            results.append(r)
    seconds = time.perf_counter() - t0
    redone_files = len(candidates) - reused_files
    report = {"executor": "ray", "parts": len(plan), "part_files": cfg.part_files,
              "reused_parts": len(found) - len(todo), "redone_parts": len(todo),
              "reused": [plan[i].name for i in sorted(set(range(len(plan))) - set(todo))],
              "files_per_s": round(redone_files / seconds, 2) if seconds > 0 else None,
              "runs": sorted(runs, key=lambda r: r["part"])}
    return results, reused_files, report


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
