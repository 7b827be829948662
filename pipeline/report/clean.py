"""Facts about a CLEAN_DIR (manifest.parquet, report.json, data/, quarantine/) for the page.

Only the manifest columns the page needs are read. Everything shown per file is a bounded,
deterministic sample (`sample.pick`); counts are always complete.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.errors import StageFailed, UsageError
from pipeline.formats.vocabulary import Kind, Reason, Status
from pipeline.report import thumbs
from pipeline.report.sample import counts, equals, pick
from pipeline.storage import Folder, Location, location, open_folder

COLUMNS = ["source", "kind", "label", "status", "reason", "detail", "duplicate_of", "output", "bytes", "sha256",
           "width", "height", "encoding", "encoding_confidence", "phash"]
PER_REASON = 8  # quarantined files shown per reason
CLUSTERS = 20  # duplicate clusters shown
PER_CLUSTER = 5  # copies shown per cluster
CONFLICTS = 20  # label conflicts shown
CLASSES_WITH_THUMBS = 24  # the largest classes get previews
PER_CLASS = 4
PER_ENCODING = 3  # text examples per non-UTF-8 encoding
GARBLED = 8  # quarantined texts shown with a snippet
REPAIRED = 8
SIZE_EDGES = [0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ASPECT_EDGES = [0, 0.5, 0.75, 0.9, 1.12, 1.34, 2.0]
UTF8 = {"utf-8", "utf-8-sig", "ascii", ""}
TEXT_REASONS = {Reason.GARBLED_TEXT, Reason.UNDECODABLE_TEXT, Reason.BINARY_CONTENT}
# never decoded for a preview: files that stopped or crashed a decoder in pipe clean, bombs, links out
NOT_DECODED = {Reason.TIMEOUT, Reason.UNREADABLE, Reason.DECOMPRESSION_BOMB, Reason.OUTSIDE_ROOT}


@dataclass
class Item:
    """One file shown on the page."""

    source: str
    label: str | None = None
    kind: str | None = None
    status: str | None = None
    reason: str | None = None
    detail: str | None = None
    width: int | None = None
    height: int | None = None
    note: str = ""  # e.g. the distance to the kept copy
    thumb: thumbs.Thumb | None = None
    snippet: str | None = None
    encoding: str | None = None
    confidence: float | None = None


@dataclass
class Group:
    name: str
    count: int
    items: list[Item] = field(default_factory=list)


@dataclass
class Cluster:
    kept: Item
    size: int  # copies merged into the kept one
    copies: list[Item] = field(default_factory=list)


@dataclass
class Histogram:
    bins: list[str]
    counts: list[int]


@dataclass
class CleanFacts:
    path: str  # the folder as given (a path, or a URL)
    problems: list[str] = field(default_factory=list)
    files: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    report: dict | None = None
    quarantined: list[Group] = field(default_factory=list)
    duplicate_clusters: int = 0
    clusters: list[Cluster] = field(default_factory=list)
    conflicts_total: int = 0
    conflicts: list[dict] = field(default_factory=list)
    classes: dict[str, int] = field(default_factory=dict)
    class_items: dict[str, list[Item]] = field(default_factory=dict)
    widths: Histogram | None = None
    heights: Histogram | None = None
    aspects: Histogram | None = None
    encodings: list[dict] = field(default_factory=list)
    encoding_examples: list[Item] = field(default_factory=list)
    repaired: Group | None = None
    garbled: Group | None = None


class _Locator:
    """Where a file of the manifest can be read now: its kept output, its quarantine copy, or the input."""

    def __init__(self, root: Folder, report: dict | None, previews: bool):
        self.root, self.previews = root, previews
        settings = (report or {}).get("settings") if isinstance(report, dict) else None
        inp = settings.get("input") if isinstance(settings, dict) else None
        self.input = _input(inp) if previews else None

    def path(self, row: dict) -> tuple[Folder | None, str | None]:
        """(the folder it is read through, its path there)."""
        src = row.get("source") or ""
        if row.get("status") == Status.KEPT and row.get("output"):
            return self.root, row["output"]
        if row.get("status") == Status.QUARANTINED and row.get("reason"):
            q = f"quarantine/{row['reason']}/{src}"
            try:
                if self.root.exists(q):
                    return self.root, q
            except (UsageError, StageFailed):  # no path inside the folder, or storage that cannot answer
                pass
        if self.input is not None and src:
            return self.input, src
        return None, None

    def item(self, row: dict, note: str = "", snippet: bool = False) -> Item:
        it = Item(source=row.get("source") or "", label=row.get("label"), kind=row.get("kind"),
                  status=row.get("status"), reason=row.get("reason"), detail=row.get("detail"),
                  width=row.get("width"), height=row.get("height"), note=note,
                  encoding=row.get("encoding"), confidence=row.get("encoding_confidence"))
        if not self.previews:
            return it
        folder, rel = self.path(row)
        if row.get("status") == Status.QUARANTINED and row.get("reason") in NOT_DECODED:
            it.thumb = thumbs.Thumb(why=f"no preview: {row['reason']}")
        elif row.get("kind") == Kind.IMAGE:
            it.thumb = thumbs.image(folder, rel)
        elif row.get("kind") == Kind.TEXT or snippet:
            it.snippet = thumbs.text_snippet(folder, rel)
        else:
            it.thumb = thumbs.Thumb(why="not an image or a text")
        return it


def gather(where: Location | Folder, previews: bool = True) -> CleanFacts:
    root = open_folder(where)
    f = CleanFacts(root.url)
    f.report = _read_report(root, f.problems)
    table = _read_manifest(root, f.problems)
    if table is None:
        return f
    loc = _Locator(root, f.report, previews)
    f.files = table.num_rows
    f.by_status = counts(table["status"])
    f.by_reason = {k: v for k, v in counts(table["reason"]).items() if k}
    f.by_kind = counts(table["kind"])
    for section in (_quarantined, _duplicates, _conflicts, _classes, _sizes, _encodings):
        try:
            section(f, table, loc)
        except (pa.ArrowException, TypeError, ValueError, KeyError, AttributeError) as e:
            # a manifest pipe clean did not write (odd types, odd values): the rest of the page still comes
            f.problems.append(f"{section.__name__.strip('_')}: could not be shown ({type(e).__name__}: {e})")
    return f


def _input(where: object) -> Folder | None:
    """The INPUT report.json names, when it is a folder that can be read here."""
    if not isinstance(where, str) or not where:
        return None
    try:
        folder = open_folder(location(where))
        return folder if folder.state() == "folder" else None
    except (UsageError, StageFailed):
        return None


def _read_report(root: Folder, problems: list[str]) -> dict | None:
    try:
        data = json.loads(root.read("report.json").decode("utf-8"))
        return data if isinstance(data, dict) else None
    except FileNotFoundError:
        problems.append("report.json is missing")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problems.append(f"report.json is not readable JSON: {e}")
    return None


def _read_manifest(root: Folder, problems: list[str]) -> pa.Table | None:
    try:
        # ParquetFile, not read_table: that one imports pyarrow.dataset and with it pandas (~2 s)
        with pq.ParquetFile(pa.BufferReader(root.read("manifest.parquet"))) as pf:
            names = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in COLUMNS if c in names])
    except (OSError, pa.ArrowException) as e:
        problems.append(f"manifest.parquet is not a readable Parquet file: {e}")
        return None
    for c in COLUMNS:  # an older or foreign manifest: the missing columns are simply empty
        if c not in table.column_names:
            table = table.append_column(c, pa.nulls(table.num_rows, pa.string()))
    return table


def _quarantined(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    q = equals(table, "status", Status.QUARANTINED)
    qt = table.filter(q)
    for reason, n in counts(qt["reason"]).items():
        rows = pick(qt, equals(qt, "reason", reason) if reason else pc.is_null(qt["reason"]), PER_REASON)
        f.quarantined.append(Group(reason or "(no reason)", n, [loc.item(r) for r in rows]))


def _duplicates(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    dups = table.filter(equals(table, "status", Status.DUPLICATE))
    if dups.num_rows == 0:
        return
    parent = dict(zip(dups["source"].to_pylist(), dups["duplicate_of"].to_pylist()))
    roots = [_root(s, parent) for s in dups["source"].to_pylist()]
    dups = dups.append_column("_root", pa.array(roots, pa.string()))
    sizes = counts(dups["_root"])
    f.duplicate_clusters = len(sizes)
    top = list(sizes.items())[:CLUSTERS]
    kept_rows = {r["source"]: r for r in table.filter(pc.is_in(table["source"], pa.array([k for k, _ in top], pa.string()))).to_pylist()}
    for root_source, n in top:
        kept_row = kept_rows.get(root_source, {"source": root_source})
        copies = pick(dups, equals(dups, "_root", root_source), PER_CLUSTER)
        f.clusters.append(Cluster(loc.item(kept_row, "kept copy"), n,
                                  [loc.item(c, _distance(c, kept_row)) for c in copies]))


def _root(source: str, parent: dict) -> str:
    """The kept copy a duplicate leads to (a copy can name another duplicate as its original)."""
    seen = {source}
    cur = parent.get(source) or source
    while cur in parent and cur not in seen:
        seen.add(cur)
        cur = parent[cur] or cur
    return cur


def _distance(copy: dict, kept: dict) -> str:
    if copy.get("reason") == Reason.EXACT_DUPLICATE:
        via = copy.get("duplicate_of")
        return "exact copy" if not via or via == kept.get("source") else f"exact copy of {via}"
    a, b = copy.get("phash"), kept.get("phash")
    if isinstance(a, str) and isinstance(b, str):  # null for files without a perceptual hash
        try:
            return f"{(int(a, 16) ^ int(b, 16)).bit_count()} bits apart (perceptual hash)"
        except ValueError:
            pass
    return copy.get("reason") or ""


def _conflicts(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    listed = (f.report or {}).get("label_conflicts")
    if not isinstance(listed, list):
        return
    f.conflicts_total = len(listed)
    shown = [c for c in listed[:CONFLICTS] if isinstance(c, dict)]
    names = [str(x) for c in shown for x in (c.get("files") or []) if isinstance(x, str)]
    rows = {r["source"]: r for r in table.filter(pc.is_in(table["source"], pa.array(names, pa.string()))).to_pylist()}
    for c in shown:
        files = [x for x in (c.get("files") or []) if isinstance(x, str)]
        f.conflicts.append({
            "labels": c.get("labels") if isinstance(c.get("labels"), dict) else {},
            "action": c.get("action"), "kept": c.get("kept"),
            "files": [loc.item(rows.get(x, {"source": x})) for x in files[:PER_CLUSTER]],
            "more": max(0, len(files) - PER_CLUSTER),
        })


def _classes(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    kept = table.filter(equals(table, "status", Status.KEPT))
    f.classes = {k: v for k, v in counts(kept["label"]).items()}
    images = kept.filter(equals(kept, "kind", Kind.IMAGE))
    for label in list(f.classes)[:CLASSES_WITH_THUMBS]:
        mask = equals(images, "label", label) if label else pc.is_null(images["label"])
        f.class_items[label] = [loc.item(r) for r in pick(images, mask, PER_CLASS)]


def _sizes(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    images = table.filter(equals(table, "kind", Kind.IMAGE))
    w = images["width"].to_numpy(zero_copy_only=False)
    h = images["height"].to_numpy(zero_copy_only=False)
    known = ~(np.isnan(w.astype("float64")) | np.isnan(h.astype("float64")))
    w, h = w[known].astype("float64"), h[known].astype("float64")
    if w.size == 0:
        return
    f.widths = _hist(w, SIZE_EDGES, "px")
    f.heights = _hist(h, SIZE_EDGES, "px")
    with np.errstate(divide="ignore", invalid="ignore"):
        aspect = np.where(h > 0, w / np.where(h > 0, h, 1), np.inf)
    f.aspects = _hist(aspect, ASPECT_EDGES, "")


def _hist(values: np.ndarray, edges: Sequence[float], unit: str) -> Histogram:
    idx = np.searchsorted(np.asarray(edges, dtype="float64"), values, side="right") - 1
    n = np.bincount(np.clip(idx, 0, len(edges) - 1), minlength=len(edges))
    bins = [f"{_num(a)}–{_num(b)}{unit}" for a, b in itertools.pairwise(edges)] + [f"≥{_num(edges[-1])}{unit}"]
    return Histogram(bins, [int(x) for x in n])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _encodings(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    texts = table.filter(pc.fill_null(pc.is_valid(table["encoding"]), False))
    if texts.num_rows:
        grouped = texts.group_by("encoding").aggregate([("encoding", "count"), ("encoding_confidence", "mean"),
                                                       ("encoding_confidence", "min")])
        rows = grouped.to_pylist()
        rows.sort(key=lambda r: (-r["encoding_count"], str(r["encoding"])))
        f.encodings = [{"encoding": r["encoding"], "files": r["encoding_count"],
                        "mean_confidence": r["encoding_confidence_mean"],
                        "min_confidence": r["encoding_confidence_min"]} for r in rows]
        for r in rows:
            if str(r["encoding"]).lower() not in UTF8:
                for x in pick(texts, equals(texts, "encoding", r["encoding"]), PER_ENCODING):
                    f.encoding_examples.append(loc.item(x, snippet=True))
    text_rows = table.filter(equals(table, "kind", Kind.TEXT))
    repaired = pc.and_(equals(text_rows, "status", Status.KEPT), pc.fill_null(pc.greater(pc.utf8_length(text_rows["detail"]), 0), False))
    n = pc.sum(repaired).as_py() or 0
    if n:
        f.repaired = Group("repaired or noted", n, [loc.item(r, snippet=True) for r in pick(text_rows, repaired, REPAIRED)])
    bad = pc.and_(equals(table, "status", Status.QUARANTINED), pc.is_in(table["reason"], pa.array(sorted(r.value for r in TEXT_REASONS))))
    bad = pc.fill_null(bad, False)
    n = pc.sum(bad).as_py() or 0
    if n:
        f.garbled = Group("quarantined texts", n, [loc.item(r, snippet=True) for r in pick(table, bad, GARBLED)])
