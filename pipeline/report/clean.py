"""Facts about a CLEAN_DIR (manifest.parquet, report.json, data/, quarantine/) for the page.

Only the manifest columns the page needs are read, each checked against the type the manifest's
schema gives it (a column of another type is left out, and the page says so). Everything shown
per file is a bounded, deterministic sample (`sample.pick`), each row checked against
``schemas/manifest_row.schema.json`` before anything of it is shown; counts are always complete.

Previews are read only inside folders named on the command line: the clean dir itself (kept
outputs, quarantine copies) and the raw input when it was given (``--input``), never where
report.json says the input was: that file is as hostile as the rest. A file read from the input
is shown only if its bytes are still those pipe clean read (its sha256), so a moved or edited
input folder shows "changed" or "gone", never another file's picture.
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
from pipeline.report import records, thumbs
from pipeline.report.sample import counts, equals, pick
from pipeline.storage import Folder, Location, open_folder

COLUMNS = ["source", "key", "kind", "label", "status", "reason", "detail", "duplicate_of", "output", "bytes", "sha256",
           "width", "height", "encoding", "encoding_confidence", "phash"]
PER_REASON = 8  # quarantined files shown per reason
CLUSTERS = 20  # duplicate clusters shown
PER_CLUSTER = 5  # copies shown per cluster
CONFLICTS = 20  # label conflicts shown
LABELS_PER_CONFLICT = 20  # labels named per conflict
CLASSES_WITH_THUMBS = 24  # the largest classes get previews
PER_CLASS = 4
PER_ENCODING = 3  # text examples per non-UTF-8 encoding
GARBLED = 8  # quarantined texts shown with a snippet
REPAIRED = 8
MAX_REPORT_BYTES = 64 * 2**20  # report.json holds counts and settings: a bigger one is not pipe clean's
SIZE_EDGES = [0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ASPECT_EDGES = [0, 0.5, 0.75, 0.9, 1.12, 1.34, 2.0]
UTF8 = {"utf-8", "utf-8-sig", "ascii", ""}
TEXT_REASONS = {Reason.GARBLED_TEXT, Reason.UNDECODABLE_TEXT, Reason.BINARY_CONTENT}
# never decoded for a preview: files that stopped or crashed a decoder in pipe clean, bombs, links out
NOT_DECODED = {Reason.TIMEOUT, Reason.UNREADABLE, Reason.DECOMPRESSION_BOMB, Reason.OUTSIDE_ROOT}


@dataclass
class Item:
    """One file shown on the page: values of a manifest row that passed its schema."""

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
    invalid: str = ""  # what is wrong with a row that broke the schema (then nothing else of it is set)


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
class InputFacts:
    """Where the raw files are, and what became of those the page wanted to show."""

    recorded: str | None = None  # where report.json says INPUT was (as it says it: hostile, only shown)
    from_clean_dir: str | None = None  # ... relative to the clean dir
    given: str | None = None  # the --input folder previews of input files were read from
    moved: bool = False  # given, but not where report.json says INPUT was
    needed: int = 0  # files shown that only the input holds, left without a preview (no --input)
    gone: int = 0  # ... no longer in the input given
    changed: int = 0  # ... whose bytes are no longer those pipe clean read


@dataclass
class CleanFacts:
    path: str  # the folder as given (a path, or a URL)
    problems: list[str] = field(default_factory=list)
    files: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    report: dict | None = None
    input: InputFacts = field(default_factory=InputFacts)
    quarantined: list[Group] = field(default_factory=list)
    duplicate_clusters: int = 0
    clusters: list[Cluster] = field(default_factory=list)
    conflicts_total: int = 0
    conflicts: list[dict] = field(default_factory=list)
    classes: dict[str, int] = field(default_factory=dict)
    class_unit: str = "samples"  # what `classes` counts: samples (an image and its caption once), or files
    class_items: dict[str, list[Item]] = field(default_factory=dict)
    widths: Histogram | None = None
    heights: Histogram | None = None
    aspects: Histogram | None = None
    encodings: list[dict] = field(default_factory=list)
    encoding_examples: list[Item] = field(default_factory=list)
    repaired: Group | None = None
    garbled: Group | None = None


class _Locator:
    """Where a file of the manifest can be read now: its kept output or its quarantine copy in the
    clean dir, or the input folder given on the command line (checked against the row's sha256)."""

    def __init__(self, root: Folder, input: Folder | None, previews: bool, present: set[str], facts: InputFacts):
        self.root, self.input, self.previews, self.present, self.facts = root, input, previews, present, facts

    def where(self, row: dict) -> tuple[Folder | None, str | None, str | None]:
        """(the folder it is read through, its path there, the sha256 its bytes must have or None)."""
        src = row.get("source") or ""
        if row.get("status") == Status.KEPT and row.get("output"):
            return self.root, row["output"], None
        if row.get("status") == Status.QUARANTINED and row.get("reason"):
            q = f"quarantine/{row['reason']}/{src}"
            try:
                if self.root.exists(q):
                    return self.root, q, None
            except (UsageError, StageFailed, OSError):  # no path inside the folder, or storage that cannot answer
                pass
        if self.input is not None and src and row.get("sha256"):
            return self.input, src, row["sha256"]
        return None, None, None

    def item(self, row: dict, note: str = "", snippet: bool = False) -> Item:
        """The row as shown, if it keeps its schema; else only its name and what is wrong."""
        shown = {k: v for k, v in row.items() if k in self.present}
        wrong = records.errors(shown, "manifest_row", partial=True)
        if wrong:
            return Item(source=str(row.get("source") or "(no source)"), invalid=wrong[0])
        it = Item(source=row.get("source") or "", label=row.get("label"), kind=row.get("kind"),
                  status=row.get("status"), reason=row.get("reason"), detail=row.get("detail"),
                  width=row.get("width"), height=row.get("height"), note=note,
                  encoding=row.get("encoding"), confidence=row.get("encoding_confidence"))
        if self.previews:
            self._preview(it, row, snippet)
        return it

    def _preview(self, it: Item, row: dict, snippet: bool) -> None:
        if row.get("status") == Status.QUARANTINED and row.get("reason") in NOT_DECODED:
            it.thumb = thumbs.Thumb(why=f"no preview: {row['reason']}")
            return
        if row.get("kind") not in (Kind.IMAGE, Kind.TEXT) and not snippet:
            it.thumb = thumbs.Thumb(why="not an image or a text")
            return
        image = row.get("kind") == Kind.IMAGE
        if row.get("bytes") == 0:
            it.thumb, it.snippet = (thumbs.Thumb(why=thumbs.EMPTY), None) if image else (None, "")
            return
        folder, rel, sha256 = self.where(row)
        if folder is None:
            self.facts.needed += 1
            it.thumb = thumbs.Thumb(why=thumbs.NO_INPUT)
            return
        data = thumbs.fetch(folder, rel, sha256, head=None if image else thumbs.SNIPPET_BYTES)
        if folder is self.input and isinstance(data, thumbs.Thumb):
            self.facts.gone += data.why == thumbs.GONE
            self.facts.changed += data.why == thumbs.CHANGED
        if isinstance(data, thumbs.Thumb):
            it.thumb = data
        elif image:
            it.thumb = thumbs.from_bytes(data) if data else thumbs.Thumb(why=thumbs.EMPTY)
        else:
            it.snippet = thumbs.snippet(data)


def gather(where: Location | Folder, previews: bool = True, input: Folder | None = None, moved: bool = False) -> CleanFacts:
    """The clean dir's facts; ``input``: the raw folder given on the command line for it, ``moved``:
    not where report.json says it was (`match_inputs`)."""
    root = open_folder(where)
    f = CleanFacts(root.url)
    f.report = _read_report(root, f.problems)
    f.input = _input_facts(f.report, input)
    f.input.moved = moved
    loaded = _read_manifest(root, f.problems)
    if loaded is None:
        return f
    table, present = loaded
    loc = _Locator(root, input, previews, present, f.input)
    f.files = table.num_rows
    f.by_status = counts(table["status"])
    f.by_reason = {k: v for k, v in counts(table["reason"]).items() if k}
    f.by_kind = counts(table["kind"])
    for section in (_quarantined, _duplicates, _conflicts, _classes, _sizes, _encodings):
        try:
            section(f, table, loc)
        except (pa.ArrowException, TypeError, ValueError, KeyError, AttributeError) as e:
            # a manifest pipe clean did not write (odd values): the rest of the page still comes
            f.problems.append(f"{section.__name__.strip('_')}: could not be shown ({type(e).__name__}: {e})")
    return f


def previews_by_key(where: Location | Folder, input: Folder | None, wanted: dict[str, str]) -> dict[str, Item]:
    """key -> the kept image of that sample, previewed from this clean dir (for `pipe labels`'
    candidates, which name a sample by its shard key and its source); ``wanted``: key -> source
    ("" when unknown). A row whose source differs from the one wanted is another dataset's."""
    root = open_folder(where)
    loaded = _read_manifest(root, [])
    if loaded is None or not wanted:
        return {}
    table, present = loaded
    rows = table.filter(pc.and_(pc.is_in(table["key"], pa.array(sorted(wanted), pa.string())),
                                pc.and_(equals(table, "kind", Kind.IMAGE), equals(table, "status", Status.KEPT))))
    loc = _Locator(root, input, True, present, InputFacts())
    out: dict[str, Item] = {}
    for row in rows.to_pylist():
        key = row.get("key")
        if key in out or (wanted.get(key) and wanted[key] != row.get("source")):
            continue
        out[key] = loc.item(row)
    return out


def recorded_input(where: Location | Folder) -> tuple[str | None, str | None]:
    """Where report.json says the input was: (its resolved path or URL, its path relative to the
    clean dir); None for what it does not say. Only used to tell which --input is whose."""
    report = _read_report(open_folder(where), [])
    loc = (report or {}).get("input")
    if isinstance(loc, dict):
        return loc.get("path"), loc.get("from_clean_dir")
    settings = (report or {}).get("settings")
    said = settings.get("input") if isinstance(settings, dict) else None  # older report.json: as typed
    return (said if isinstance(said, str) and said else None), None


def match_inputs(cleans: list[Folder], given: list[Folder]) -> list[tuple[Folder | None, bool]]:
    """For each clean dir, the --input folder that is its input and whether it moved since (None:
    none given). A folder matches where report.json says the input was (resolved, or relative to
    the clean dir); one input left for one clean dir left is taken as moved (its files are checked
    against their sha256 anyway). An input that is no clean dir's is a UsageError."""
    out: list[tuple[Folder | None, bool]] = [(None, False)] * len(cleans)
    left = list(given)
    for i, c in enumerate(cleans):
        path, rel = recorded_input(c)
        spots = {path} if path else set()
        if rel and c.local_path is not None:
            spots.add(str((c.local_path / rel).resolve()))
        hit = next((g for g in left if g.identity() in spots), None)
        if hit is not None:
            out[i] = (hit, False)
            left.remove(hit)
    free = [i for i, (g, _) in enumerate(out) if g is None]
    if len(left) == 1 and len(free) == 1:
        out[free[0]] = (left.pop(), True)
    if left:
        raise UsageError(f"--input {left[0].url} is the input of none of the clean dirs given (report.json names where "
                         "each was made from); give one --input per clean dir")
    return out


def _input_facts(report: dict | None, given: Folder | None) -> InputFacts:
    loc = (report or {}).get("input")
    settings = (report or {}).get("settings")
    f = InputFacts()
    if isinstance(loc, dict):
        f.recorded, f.from_clean_dir = loc.get("path"), loc.get("from_clean_dir")
    elif isinstance(settings, dict) and isinstance(settings.get("input"), str):
        f.recorded = settings["input"]
    f.given = given.url if given is not None else None
    return f


def _read_report(root: Folder, problems: list[str]) -> dict | None:
    """report.json, if it keeps its schema (else the page names what is wrong and uses none of it)."""
    try:
        data = json.loads(root.read_contained("report.json", max_bytes=MAX_REPORT_BYTES).decode("utf-8"))
    except FileNotFoundError:
        problems.append("report.json is missing")
        return None
    except PermissionError:
        problems.append(records.OUTSIDE.format("report.json"))
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        problems.append(f"report.json is not readable JSON: {str(e)[:200]}")
        return None
    wrong = records.errors(data, "report")
    if wrong:
        problems.append(f"report.json breaks schemas/report.schema.json ({wrong[0]}): none of it is used")
        return None
    return data


def _read_manifest(root: Folder, problems: list[str]) -> tuple[pa.Table, set[str]] | None:
    """The columns the page needs, each of the type the manifest's schema gives it, and the names
    of those the file really has (a missing or mistyped column is all nulls, and not "present")."""
    from pipeline.formats.manifest import COLUMNS as TYPES

    try:
        # ParquetFile, not read_table: that one imports pyarrow.dataset and with it pandas (~2 s)
        with pq.ParquetFile(pa.BufferReader(root.read_contained("manifest.parquet"))) as pf:
            names = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in COLUMNS if c in names])
    except PermissionError:
        problems.append(records.OUTSIDE.format("manifest.parquet"))
        return None
    except (OSError, pa.ArrowException) as e:
        problems.append(f"manifest.parquet is not a readable Parquet file: {e}")
        return None
    present = set()
    for c in COLUMNS:  # an older or foreign manifest: the missing columns are simply empty
        want = TYPES.field(c).type
        if c in table.column_names:
            got = table[c].type
            try:
                col = _typed(table[c], want)
                table = table.set_column(table.column_names.index(c), c, col)
                present.add(c)
                continue
            except (pa.ArrowException, TypeError, ValueError):
                problems.append(f"manifest.parquet column {c} holds {got}, not {want}: it could not be shown")
                table = table.remove_column(table.column_names.index(c))
        table = table.append_column(c, pa.nulls(table.num_rows, want))
    return table, present


def _typed(column: pa.ChunkedArray, want: pa.DataType) -> pa.ChunkedArray:
    """``column`` as ``want``, where that loses nothing (int32 to int64, large_string to string, an
    all-null column); anything else is a TypeError."""
    got = column.type
    same_kind = (got == want or pa.types.is_null(got)
                 or (pa.types.is_integer(want) and pa.types.is_integer(got))
                 or (pa.types.is_floating(want) and (pa.types.is_floating(got) or pa.types.is_integer(got)))
                 or (pa.types.is_string(want) and pa.types.is_large_string(got))
                 or (pa.types.is_list(want) and (pa.types.is_list(got) or pa.types.is_large_list(got))
                     and pa.types.is_integer(got.value_type)))
    if not same_kind:
        raise TypeError(f"{got} is not {want}")
    return column if got == want else column.cast(want, safe=True)


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
        labels: dict = c["labels"] if isinstance(c.get("labels"), dict) else {}
        f.conflicts.append({
            "labels": dict(itertools.islice(labels.items(), LABELS_PER_CONFLICT)),
            "more_labels": max(0, len(labels) - LABELS_PER_CONFLICT),
            "action": c.get("action"), "kept": c.get("kept"),
            "files": [loc.item(rows.get(x, {"source": x})) for x in files[:PER_CLUSTER]],
            "more": max(0, len(files) - PER_CLUSTER),
        })


def _classes(f: CleanFacts, table: pa.Table, loc: _Locator) -> None:
    """Kept samples per label: an image and its caption share a key and count once (files, for a
    manifest without keys)."""
    kept = table.filter(equals(table, "status", Status.KEPT))
    if "key" in loc.present:
        per = kept.group_by("label").aggregate([("key", "count_distinct")]).to_pylist()
        per.sort(key=lambda r: (-r["key_count_distinct"], r["label"] or ""))
        f.classes = {r["label"] or "": r["key_count_distinct"] for r in per}
    else:
        f.class_unit = "files"
        f.classes = counts(kept["label"])
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
