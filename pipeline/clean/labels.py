"""Read a labels file (`--labels labels.csv|jsonl`, columns ``path,label[,text]``).

The file itself is decoded like any text (`encodings.decode_bytes`: a BOM, UTF-16, GBK from
Excel on a Chinese Windows...); labels are NFC (`pipeline.formats.labels`). Paths are relative to
INPUT, with ``/`` or ``\\``. What did not
fit is reported in report.json, never dropped silently: rows naming files that are not there,
rows without a label, paths listed twice with different labels (the first row wins), and the
files that no row names (each of those ends ``missing_label`` in the manifest).

The optional ``text`` column is a caption for the file of that row (see `stage.py`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import UsageError
from pipeline.formats.labels import label_name
from pipeline.formats.vocabulary import Kind

REPORT_LIMIT = 100  # paths listed per problem in report.json (the counts are exact)


@dataclass
class Labels:
    labels: dict[str, str] = field(default_factory=dict)  # relative path -> label
    captions: dict[str, str] = field(default_factory=dict)  # relative path -> caption text
    notes: dict = field(default_factory=dict)  # for report.json
    exclude: set[str] = field(default_factory=set)  # the labels file itself, if inside INPUT


def read_labels(path: Path, input_root: Path | None) -> Labels:
    from pipeline.media.text.encodings import decode_bytes

    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the labels file {path}: {e.strerror or e}") from None
    d = decode_bytes(raw)
    if d.text is None:
        raise UsageError(f"the labels file {path} is not readable text ({d.detail})")
    rows = _rows(d.text, path)
    out = Labels()
    conflicting, unlabeled = [], []
    for n, row in rows:
        rel = normalize_path(str(row.get("path") or ""))
        label = row.get("label")
        label = "" if label is None else label_name(str(label).strip())
        if not rel:
            continue
        if not label:
            unlabeled.append(f"line {n}: {rel}")
            continue
        if rel in out.labels and out.labels[rel] != label:
            conflicting.append(f"line {n}: {rel} is {label!r} here, {out.labels[rel]!r} earlier (kept)")
            continue
        out.labels[rel] = label
        text = row.get("text")
        if text is not None and str(text).strip():
            out.captions[rel] = str(text)
    out.notes = {"file": str(path), "encoding": d.encoding, "rows": len(rows), "labelled_files": len(out.labels)}
    _note(out.notes, "rows_without_label", unlabeled)
    _note(out.notes, "conflicting_rows", conflicting)
    try:  # the labels file inside a local INPUT is no sample
        if input_root is not None:
            out.exclude.add(path.resolve().relative_to(input_root.resolve()).as_posix())
    except ValueError:
        pass
    return out


def normalize_path(p: str) -> str:
    """``.\\\\cats\\\\a.jpg`` and ``./cats/a.jpg`` -> ``cats/a.jpg``."""
    p = p.strip().replace("\\", "/")
    while p.startswith("./"):
        p = p[2:]
    return p.lstrip("/")


def _note(notes: dict, name: str, items: list[str]) -> None:
    if items:
        notes[name] = {"count": len(items), "first": items[:REPORT_LIMIT]}


def _rows(text: str, path: Path) -> list[tuple[int, dict]]:
    if path.suffix.lower() in (".jsonl", ".ndjson") or text.lstrip().startswith("{"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise UsageError(f"labels file {path}, line {n}: not valid JSON ({e})") from None
            if not isinstance(obj, dict) or "path" not in obj or "label" not in obj:
                raise UsageError(f"labels file {path}, line {n}: needs an object with \"path\" and \"label\"")
            rows.append((n, obj))
        return rows
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    reader = csv.DictReader(io.StringIO(text, newline=""), dialect=dialect)
    fields = [f.strip().lower() for f in (reader.fieldnames or [])]
    if not {"path", "label"} <= set(fields):
        raise UsageError(f"labels file {path} needs a header row with the columns path,label[,text]; found {','.join(fields) or 'nothing'}")
    reader.fieldnames = fields
    try:
        with _cells_up_to(len(text)):
            return [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise UsageError(f"labels file {path}, line {reader.line_num}: {e}") from None


@contextlib.contextmanager
def _cells_up_to(n: int) -> Iterator[None]:
    """Let the csv module read a cell as long as the whole file (its default limit, 128 KiB,
    refused a whole labels file over one long caption, which the file being in memory already
    makes no cheaper to refuse): a caption's length is judged as any caption's is, too_large past
    --max-text-bytes (`attach_captions`)."""
    before = csv.field_size_limit()
    csv.field_size_limit(max(before, n + 1))
    try:
        yield
    finally:
        csv.field_size_limit(before)


def check_against(lab: Labels, listing) -> dict:
    """Rows naming files that are not in INPUT, and files no row names (``listing``: the
    `pipeline.clean.listing.Listing`, read a batch at a time)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.clean.columns import KINDS

    paths = pa.array(list(lab.labels), pa.string())
    found: set[str] = set()
    unlabelled: list[str] = []
    other = KINDS.index(Kind.OTHER)
    count = 0
    for _, t in listing.columns(["source", "kind", "label", "problem"]):
        source = t.column("source")
        found.update(source.filter(pc.is_in(source, value_set=paths)).to_pylist())
        loose = pc.and_(pc.and_(pc.equal(t.column("label"), -1), pc.not_equal(t.column("kind"), other)),
                        pc.is_null(t.column("problem")))
        names = source.filter(loose)
        count += len(names)
        if len(unlabelled) < REPORT_LIMIT:
            unlabelled += names.slice(0, REPORT_LIMIT - len(unlabelled)).to_pylist()
    missing = sorted(p for p in lab.labels if p not in found)
    notes: dict = {}
    _note(notes, "rows_naming_missing_files", missing)
    if count:
        notes["files_without_label"] = {"count": count, "first": unlabelled}
    return notes


def attach_captions(results, captions: dict[str, str], listing, max_bytes: int | None = None) -> dict:
    """Give each image the caption the labels file's text column has for it, normalised like a
    caption file (or the reason it was rejected). A caption file beside the image wins.

    ``results``: `columns.Columns` (its ``caption`` and ``caption_reason``, by file, are set);
    ``listing``: the files' `Listing`, whose sources are looked up in ``captions``.
    A caption longer than ``max_bytes`` (--max-text-bytes) in UTF-8 is too_large, as a caption
    file of that size would be: judging it would cost the same memory."""
    import numpy as np

    from pipeline.clean.columns import IMAGE, TEXT
    from pipeline.media.text.clean import MAX_TEXT_BYTES, TextSettings

    settings = TextSettings(max_bytes=MAX_TEXT_BYTES if max_bytes is None else max_bytes)

    with_file = np.zeros(results.n, dtype=bool)  # by a key's first file: the key has a caption file
    with_file[results.lead[results.kind == TEXT]] = True
    results.caption.clear()  # from this run's labels file only, never the journal's
    results.caption_reason.clear()
    ignored, rejected, given = [], [], 0
    for begin, t in listing.columns(["source"]):
        for i, source in enumerate(t.column("source").to_pylist(), begin):
            raw = captions.get(source)
            if raw is None or results.kind[i] != IMAGE:
                continue
            if with_file[results.lead[i]]:
                ignored.append(source)
                continue
            o = _judge_caption(raw, settings)
            if o.reason:
                results.caption_reason[i] = f"{o.reason} ({o.detail})"
                rejected.append(f"{source}: {o.reason}")
            else:
                results.caption[i] = o.text
                given += 1
    notes: dict = {"captions": given} if given else {}
    _note(notes, "captions_ignored_for_a_caption_file", ignored)
    _note(notes, "captions_rejected", rejected)
    return notes


def _judge_caption(raw: str, settings):
    """A labels-file caption judged like a caption file, size limit included. More characters
    than the limit allows bytes is too large in any encoding: refused before encoding it."""
    from pipeline.formats.vocabulary import Reason
    from pipeline.media.text.clean import TextOutcome, clean_text

    if len(raw) > settings.max_bytes:
        return TextOutcome(reason=Reason.TOO_LARGE,
                           detail=f"{len(raw)} characters > --max-text-bytes {settings.max_bytes} bytes")
    return clean_text(raw.encode("utf-8"), settings)
