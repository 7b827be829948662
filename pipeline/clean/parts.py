"""pipe clean in parts, on any executor: the plan, the parts' results files, and the driver's side.

The sorted candidates are cut into parts (`pipeline.executors.parts`); every file of a part is
processed by `process.process` in worker processes (the executor's), and the part's results
(`FileResult`s as an Arrow IPC file under ``.pipe/parts/``) are written last, where the part
ran (`finish_part`): a part's results file is what a rerun reuses, file by file. A result still
stands when its input is unchanged and its output is there (`CleanDir.reusable`); the files of
a part that no longer stand are processed again and the part's results file written anew.

Of each part the driver keeps only what deciding across parts needs (`columns.compact`, made
where the part ran: ~33 bytes a file) and reads the rest back from the results files when it
needs it: a few files' strings while deciding, every part whole, one at a time, when it writes
the manifest (`columns.Rows`). The candidates stay in the listing on the driver's disk until a
part is handed over (`PartItems`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.core.errors import StageFailed, UsageError
from pipeline.executors import parts as partlib
from pipeline.executors.parts import PARTS_DIR, SUFFIX, Part
from pipeline.storage import EXAMPLE_URL, Folder, Location

if TYPE_CHECKING:
    from pipeline.clean.columns import Columns, Gatherer
    from pipeline.clean.listing import Listing

__all__ = ["PARTS_DIR", "SUFFIX", "Part", "plan", "read_results", "read_table", "sweep", "write_results"]

FORMAT = {b"pipe.part_results": b"2"}  # the results file's format (1: JSON lines, named .jsonl)


def describe(c: Candidate) -> list:
    """What of a candidate its part's results depend on (its bytes are checked on reuse)."""
    return [c.source, c.key, str(c.kind), c.fmt, c.problem and str(c.problem), c.detail]


def plan(candidates: Sequence[Candidate], settings: dict, max_files: int) -> list[Part]:
    """The parts of a listing: deterministic for the same candidates, settings and part size."""
    return partlib.plan(candidates, settings, max_files, describe)


def write_results(where: Location | Folder, part: Part, results: Sequence[FileResult]) -> None:
    """The part's results file, atomically, written after every output of the part."""
    from pipeline.clean.columns import to_table

    partlib.write_table(where, part, to_table(results), FORMAT)


def read_table(where: Location | Folder, part: Part, columns: Sequence[str] | None = None):
    """The part's results as an Arrow table (only ``columns``, when given), or None when it has
    no complete results file of this format and schema."""
    from pipeline.clean.columns import RESULTS

    return partlib.read_table(where, part, RESULTS, FORMAT, columns)


def read_results(where: Location | Folder, part: Part) -> list[FileResult] | None:
    """The part's results, or None when it has no complete, readable results file."""
    from pipeline.clean.columns import iter_results

    table = read_table(where, part)
    return None if table is None else list(iter_results(table))


def sweep(where: Location | Folder, parts: Sequence[Part]) -> None:
    """Remove results files of parts that are not in this plan (an earlier run's other listing)."""
    partlib.sweep(where, parts)


@dataclass(frozen=True)
class PartJob:
    """One part to process where the executor runs it: where its results go, and the results of
    its files that still stand (by position in the part), which are not processed again."""

    part: Part
    out: Folder
    inp: Folder
    carried: dict[int, FileResult] | None = None

    @property
    def name(self) -> str:
        return self.part.name

    def __len__(self) -> int:
        return len(self.part)


def start_part(job: PartJob) -> None:
    """Before a part's files: the folders must be the driver's (a local folder on another
    machine must be a shared file system there, at the same path)."""
    from pipeline.storage.output import read_marker

    if read_marker(job.out) is None:
        raise UsageError(f"CLEAN_DIR {job.out.url} is not visible where this part runs ({_host()}: no .pipe/state.json "
                         "there): a local output must be a shared file system mounted at the same path on every node "
                         f"the parts run on; or write to object storage ({EXAMPLE_URL})")
    if job.inp.state() != "folder":
        raise UsageError(f"INPUT {job.inp.url} is not visible where this part runs ({_host()}): a local input must be a "
                         "shared file system mounted at the same path on every node the parts run on; or read it from "
                         f"object storage ({EXAMPLE_URL})")


def finish_part(job: PartJob, computed: list[FileResult]):
    """Where the part ran, after its files: its results file (the results still standing and
    the new ones, in order), and what the driver keeps of it (`columns.compact`)."""
    from pipeline.clean.columns import compact, to_table

    results = computed
    if job.carried:
        new = iter(computed)
        results = [job.carried[k] if k in job.carried else next(new) for k in range(len(job.part))]
    table = to_table(results)
    try:
        partlib.write_table(job.out, job.part, table, FORMAT)
    except OSError as e:
        raise StageFailed(f"could not write the cleaned output: {e}") from None
    return compact(table)


def _host() -> str:
    import socket

    return socket.gethostname()


class PartItems(Sequence[Candidate]):
    """The candidates of a part that are to be processed (those whose results do not stand),
    read from the listing when the executor takes them: the driver holds no part's candidates
    while it waits to hand the part over."""

    def __init__(self, listing: Sequence[Candidate], part: Part, skip: Collection[int] = ()):
        self._listing, self._part, self._skip = listing, part, frozenset(skip)

    def __len__(self) -> int:
        return len(self._part) - len(self._skip)

    def __iter__(self) -> Iterator[Candidate]:
        for k, c in enumerate(self._listing[self._part.begin:self._part.end]):
            if k not in self._skip:
                yield c

    def __getitem__(self, i):  # (read whole, for the odd caller that indexes)
        return list(self)[i]


def process_in_parts(cfg, candidates: Listing, executor, place, items, show_progress: bool,
                     on_first: Callable[[], None]) -> tuple[Columns, int, dict | None]:
    """Every candidate's result in order as `Columns`, how many were reused, and what the
    executor says about how the parts ran (the report's "parts", or None).

    ``candidates``: the `Listing`; ``place``: the `CleanDir`; ``items``: the per-file work
    (`pipeline.executors.Items`, its part's ``start`` and ``finish`` this module's);
    ``on_first``: called once the first result is in."""
    from pipeline.clean.columns import compact, iter_results
    from pipeline.core.ui import progress

    t0 = time.perf_counter()
    plan_ = plan(candidates, cfg.fingerprint(), executor.part_size(cfg.part_files))
    earlier = _earlier_results(place.out, plan_)  # of parts another listing cut: reused file by file
    sweep(place.out, plan_)
    gathered = gatherer(place.out, plan_, candidates, place.staging)
    jobs: list[tuple[PartJob, PartItems]] = []
    reused_files = 0
    with progress(f"clean ({len(plan_)} parts)" if len(plan_) > 1 else "clean", len(candidates), show_progress) as advance:
        for p in plan_:
            cands = candidates[p.begin:p.end]
            old = read_table(place.out, p)
            olds: list[FileResult | None] = (list(iter_results(old)) if old is not None
                                             else [earlier.pop(c.source, None) for c in cands])
            carried = {k: r for k, (r, c) in enumerate(zip(olds, cands)) if r is not None and place.reusable(r, c)}
            del olds, cands
            reused_files += len(carried)
            for r in carried.values():
                advance(r.reason is None, True)
            job = PartJob(p, place.out, place.inp, carried or None)
            if old is not None and len(carried) == len(p):
                _add(gathered, candidates, p, compact(old))
            elif len(carried) == len(p):  # every file stands, as an earlier listing's part had it
                _add(gathered, candidates, p, finish_part(job, []))
            else:
                jobs.append((job, PartItems(candidates, p, carried)))
            del old
        earlier.clear()

        runs: list[dict] = []
        shown = [0]  # files the executor showed one by one (`item_done`) that no finished part has counted yet
        first = [on_first]

        def started() -> None:
            if first:
                first.pop()()

        def item_done(r: FileResult) -> None:
            advance(r.reason is None, False)
            shown[0] += 1
            started()

        def part_done(k: int, table, run) -> None:
            job = jobs[k][0]
            _add(gathered, candidates, job.part, table)
            if run is not None:
                runs.append(run.as_dict())
            reasons = (table.column("reason").to_numpy() >= 0).tolist()
            computed = [failed for i, failed in enumerate(reasons) if not job.carried or i not in job.carried]
            already = min(shown[0], len(computed))
            shown[0] -= already
            for failed in computed[already:]:
                advance(not failed, False)
            started()

        if not any(todo for _, todo in jobs):
            started()
        if jobs:
            executor.map_parts(items, jobs, part_done, item_done, progress=show_progress)
    cols = gathered.finish()
    seconds = time.perf_counter() - t0
    redone_files = len(candidates) - reused_files
    todo_parts = {job.part.index for job, _ in jobs}
    report = executor.summary(parts=len(plan_), part_files=cfg.part_files, reused_parts=len(plan_) - len(jobs),
                              redone_parts=len(jobs), reused=[p.name for p in plan_ if p.index not in todo_parts],
                              files_per_s=round(redone_files / seconds, 2) if seconds > 0 else None,
                              runs=sorted(runs, key=lambda r: r["part"]))
    return cols, reused_files, report


def gatherer(out: Folder, plan_: Sequence[Part], listing: Listing, where: Path | None = None) -> Gatherer:
    """Where the driver collects what it keeps of every part (`gather`, or a part's own
    `finish_part` value), the parts' results files being where the rest is read back from."""
    from pipeline.clean.columns import Gatherer, Rows

    def read(k: int, columns: Sequence[str] | None):
        table = read_table(out, plan_[k], columns)
        if table is None:
            raise StageFailed(f"the results file of part {plan_[k].name} in {out.url}/{PARTS_DIR} went away during the run")
        return table

    starts = [p.begin for p in plan_] + [plan_[-1].end if plan_ else 0]
    return Gatherer(len(listing), Rows(starts, read), listing.label_names, where)


def gather(where: Location | Folder, part: Part, listing: Listing, gathered: Gatherer) -> bool:
    """What the driver keeps of a finished part, into ``gathered`` (False: no results file)."""
    from pipeline.clean.columns import GATHER, compact

    table = read_table(where, part, GATHER)
    if table is None:
        return False
    _add(gathered, listing, part, compact(table))
    return True


def _add(gathered: Gatherer, listing: Listing, part: Part, table) -> None:
    """A part's `compact` columns, labelled from the listing: labels are not part of a part's
    work (a labels file may change them), and a key's first file is the listing's to know."""
    gathered.add(part.begin, table, listing.labels(part.begin, part.end), listing.leads(part.begin, part.end))


def _earlier_results(out: Folder, plan_: Sequence[Part]) -> dict[str, FileResult]:
    """The results in results files that are not this plan's (an interrupted run's, before files
    were added or removed), by source: what they say of a file still stands if it is unchanged."""
    from pipeline.clean.columns import RESULTS, iter_results

    found: dict[str, FileResult] = {}
    for name in partlib.others(out, plan_):
        table = partlib.read_file(out, name, RESULTS, FORMAT)
        if table is not None:
            found.update((r.source, r) for r in iter_results(table))
    return found
