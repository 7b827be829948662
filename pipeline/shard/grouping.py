"""Kept manifest rows (sorted by key) made into samples' columns, a batch at a time and over whole
columns with Arrow: the rows grouped by key (an image and its caption are one sample) and
checked, each sample's files stat'ed once (their sizes decide the shard layout), its shard key,
perceptual hash and recorded pixel numbers, and its `.json` member assembled byte for byte.
`samples` reads the manifest and hands its rows here; the values a column holds where a sample
has no such file or number (`NONE`, `UNRECORDED`) are defined here, where the columns are made."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import UsageError
from pipeline.formats.manifest_row import ADDED_LATER, NAMES
from pipeline.formats.sample import IMAGE_EXTS, shard_key
from pipeline.formats.vocabulary import Kind

IMAGE_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
STAT_BATCH = 8192  # samples whose files are stat'ed at once
NONE = -1  # in a size, mtime or extension column: the sample has no such file
UNRECORDED = -1  # in a pixel column: pipe clean recorded no numbers for the image (decode it to know)


class Grouped:
    """The kept rows (sorted by key) as groups, one per key. The samples are the labelled groups
    and the image-caption pairs without a label (data for contrastive training, `taken`); an
    image alone or a text alone without a label is of no use to any objective: left out, counted."""

    def __init__(self, kept):
        import pyarrow as pa
        import pyarrow.compute as pc

        self.kept, n = kept, kept.num_rows
        self.keys = kept.column(NAMES.key).combine_chunks()
        new = np.ones(n, dtype=bool)
        if n > 1:
            new[1:] = to_mask(pc.not_equal(self.keys.slice(1), self.keys.slice(0, n - 1)))
        self.starts = np.flatnonzero(new)  # the first row of each group
        self.groups = len(self.starts)
        self.group = np.cumsum(new) - 1  # each row's group
        kind = kept.column(NAMES.kind)
        is_image, is_text = to_mask(pc.equal(kind, Kind.IMAGE.value)), to_mask(pc.equal(kind, Kind.TEXT.value))
        images, texts = (np.bincount(self.group[rows], minlength=self.groups) for rows in (is_image, is_text))
        misshapen = (images > 1) | (texts > 1) | (images + texts != np.bincount(self.group, minlength=self.groups))
        label = kept.column(NAMES.label)
        first = label.take(self.starts[self.group])
        same = pc.or_kleene(pc.equal(label, first), pc.and_(pc.is_null(label), pc.is_null(first)))
        self.wrong = misshapen.copy()  # groups pipe clean never writes: `samples._explain` says what is wrong
        np.logical_or.at(self.wrong, self.group, ~to_mask(same))
        group_label = label.take(self.starts)
        self.labelled = ~to_mask(pc.or_kleene(pc.is_null(group_label), pc.equal(group_label, ""))) & ~self.wrong
        caption = kept.column(NAMES.caption)
        captioned = to_mask(pc.greater(pc.utf8_length(pc.fill_null(caption, "")), 0))
        with_caption = np.bincount(self.group[is_image & captioned], minlength=self.groups) > 0  # a labels-file caption
        self.pair = (images == 1) & ((texts == 1) | with_caption) & ~self.wrong
        self.taken = self.labelled | self.pair
        self.sample_groups = np.flatnonzero(self.taken)
        self.samples = len(self.sample_groups)
        # no label: null (an empty label from the labels file is none either)
        self.label = pc.if_else(_mask_of(self.labelled[self.sample_groups]), group_label.take(self.sample_groups),
                                pa.scalar(None, group_label.type))
        self.image_row, self.text_row = self._row_of(is_image), self._row_of(is_text)
        # a caption from the labels file (no row of its own) is the text of an image without a text row
        self.caption_row = np.where((self.text_row < 0) & (self.image_row >= 0), self.image_row, -1)
        self.caption_row[self.caption_row >= 0] = np.where(captioned[self.caption_row[self.caption_row >= 0]],
                                                           self.caption_row[self.caption_row >= 0], -1)
        output = kept.column(NAMES.output)
        self.image_path = _rows(output, self.image_row)
        self.text_path = pc.coalesce(_rows(output, self.text_row), _rows(caption, self.caption_row))
        self.image_ext, bad_ext = _exts(self.image_path)
        self.bad = (bad_ext | _bad_paths(self.image_path, self.image_row >= 0)
                    | _bad_paths(self.text_path, (self.text_row >= 0) | (self.caption_row >= 0)))

    def _row_of(self, rows: np.ndarray) -> np.ndarray:
        """Each sample's row among ``rows`` (its image, or its text), -1 for none."""
        at = np.full(self.groups, -1, dtype=np.int64)
        at[self.group[rows]] = np.flatnonzero(rows)
        return at[self.sample_groups]

    def first_bad(self) -> int | None:
        """The first group (in key order) that a check finds wrong, before any file is stat'ed."""
        wrong = np.flatnonzero(self.wrong)
        bad = self.sample_groups[self.bad]
        found = [int(a[0]) for a in (wrong, bad) if len(a)]
        return min(found) if found else None

    def columns(self, stats: Stats, part: slice) -> dict[str, Any]:
        """The columns of a ``part`` of the samples (in manifest-key order) as `Samples` holds them:
        made a part at a time, so the temporaries of the .json assembly stay small."""
        import pyarrow as pa
        import pyarrow.compute as pc

        kept = self.kept
        image_row, text_row, caption_row = self.image_row[part], self.text_row[part], self.caption_row[part]
        keys = self.keys.take(self.starts[self.sample_groups[part]])
        skeys = _shard_keys(keys)
        phash, has_phash = _phashes(_rows(kept.column(NAMES.phash), image_row), keys)
        source = kept.column(NAMES.source)
        label = self.label[part]
        meta = _meta(
            label=label, manifest_key=pc.if_else(pc.equal(keys, skeys), pa.scalar(None, pa.string()), keys),
            width=_rows(kept.column(NAMES.width), image_row), height=_rows(kept.column(NAMES.height), image_row),
            has_image=image_row >= 0, image_source=_rows(source, image_row),
            text_source=pc.coalesce(_rows(source, text_row),
                                    pc.binary_join_element_wise(_rows(source, caption_row), " (labels file caption)", "")),
            has_text_row=text_row >= 0, encoding=_rows(kept.column(NAMES.encoding), text_row),
            confidence=_rows(kept.column(NAMES.encoding_confidence), text_row))
        return {"key": skeys, "label": label, "meta": meta, "image": self.image_path[part], "image_ext": self.image_ext[part],
                "image_size": stats.image_size[part], "image_mtime": stats.image_mtime[part], "text": self.text_path[part],
                "text_size": stats.text_size[part], "text_mtime": stats.text_mtime[part], "phash": phash, "has_phash": has_phash,
                "pixels": recorded_pixels(*(_rows(kept.column(c), image_row) for c in ADDED_LATER))}


def _mask_of(mask: np.ndarray):
    import pyarrow as pa

    return pa.array(mask, pa.bool_())


def to_mask(bools) -> np.ndarray:
    """An Arrow boolean array as numpy (null: False)."""
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(bools, False).to_numpy(zero_copy_only=False), dtype=bool)


def _rows(column, rows: np.ndarray):
    """``column``'s cells at ``rows`` (an array; null where the row is -1)."""
    import pyarrow as pa

    return column.take(pa.array(np.maximum(rows, 0), mask=rows < 0)).combine_chunks()


def _bad_paths(paths, present: np.ndarray) -> np.ndarray:
    """Paths that name no file inside CLEAN_DIR (empty, absolute, or with a '..' part), where present."""
    import pyarrow.compute as pc

    escapes = to_mask(pc.match_substring_regex(paths, r"^/|(^|/)\.\.(/|$)"))
    return present & (escapes | ~to_mask(pc.greater(pc.utf8_length(pc.fill_null(paths, "")), 0)))


def _exts(paths) -> tuple[np.ndarray, np.ndarray]:
    """Each image's extension (index into IMAGE_EXTS; NONE without an image) and which are no
    image extension. The extension is what os.path.splitext finds, lower-cased: the name's last
    dot, unless the name (after its leading dots) has no other."""
    import pyarrow.compute as pc

    found = np.full(len(paths), -2, dtype=np.int8)
    lower = pc.ascii_lower(paths)  # (no other character lower-cases to one of these letters)
    for suffix, ext in IMAGE_EXT.items():
        found[to_mask(pc.match_substring_regex(lower, rf"(^|/)\.*[^/.][^/]*\{suffix}$"))] = IMAGE_EXTS.index(ext)
    found[~to_mask(pc.is_valid(paths))] = NONE
    bad = found == -2
    found[bad] = NONE
    return found, bad


@dataclass
class Stats:
    image_size: np.ndarray
    image_mtime: np.ndarray
    text_size: np.ndarray
    text_mtime: np.ndarray
    failed: int | None  # the first sample with a file that is missing or no regular file


def stat_outputs(clean_dir: Path, images, texts) -> Stats:
    """Size and mtime_ns of every sample's files (``images``, ``texts``: Arrow string columns,
    null where a sample has none; NONE then): the only stat of each file in the run, relative
    to CLEAN_DIR's descriptor (no path joined per file), a batch of samples at a time (its
    paths as str only while it is stat'ed). Stops at the first sample whose file is not there."""
    n = len(images)
    out = np.full((n, 4), NONE, dtype=np.int64)
    root = os.open(clean_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for lo in range(0, n, STAT_BATCH):
            size = min(STAT_BATCH, n - lo)
            failed = _stat_batch(root, images.slice(lo, size), texts.slice(lo, size), out[lo : lo + size])
            if failed is not None:
                return Stats(out[:, 0], out[:, 1], out[:, 2], out[:, 3], lo + failed)
    finally:
        os.close(root)
    return Stats(out[:, 0], out[:, 1], out[:, 2], out[:, 3], None)


def _stat_batch(root: int, images, texts, out: np.ndarray) -> int | None:
    """Fill ``out`` (size, mtime of the image; size, mtime of the text) for a batch: each column's
    files stat'ed in one C-level map, their numbers read the same way. A batch with a file that
    is missing or no regular file is gone through sample by sample (`_first_failed`): the
    first such sample, its image before its text, as the run has always reported it."""
    from functools import partial
    from operator import attrgetter

    at = partial(os.stat, dir_fd=root)
    found = []
    try:
        for col, paths in ((0, images), (2, texts)):
            present = np.flatnonzero(to_mask(paths.is_valid()))
            found.append((col, present, list(map(at, paths.drop_null().to_pylist()))))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return _first_failed(root, images.to_pylist(), texts.to_pylist())
    for col, present, stats in found:
        modes = np.fromiter(map(attrgetter("st_mode"), stats), dtype=np.int64, count=len(stats))
        if np.any((modes & 0o170000) != stat.S_IFREG):  # (stat.S_ISREG, of the whole column)
            return _first_failed(root, images.to_pylist(), texts.to_pylist())
        out[present, col] = np.fromiter(map(attrgetter("st_size"), stats), dtype=np.int64, count=len(stats))
        out[present, col + 1] = np.fromiter(map(attrgetter("st_mtime_ns"), stats), dtype=np.int64, count=len(stats))
    return None


def _first_failed(root: int, images: list[str | None], texts: list[str | None]) -> int:
    """The first sample of a batch with a file that is missing or no regular file."""
    for i, (image, text) in enumerate(zip(images, texts)):
        for rel in (image, text):
            if rel is None:
                continue
            try:
                st = os.stat(rel, dir_fd=root)
            except (OSError, ValueError):
                return i
            if not stat.S_ISREG(st.st_mode):
                return i
    raise AssertionError("a file of the batch was missing, and then there")


def _shard_keys(keys):
    """`shard_key` of every key: keys already safe and short (all that pipe clean writes) are
    their own; only the others go through Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.formats.sample import KEY_PATTERN, MAX_KEY

    safe = to_mask(pc.and_(pc.match_substring_regex(keys, KEY_PATTERN), pc.less_equal(pc.utf8_length(keys), MAX_KEY)))
    if safe.all():
        return keys
    out = keys.to_pylist()
    for i in np.flatnonzero(~safe).tolist():
        out[i] = shard_key(out[i])
    return pa.array(out, pa.string())


def unique_keys(keys):
    """Shard keys made unique: only keys shortened or made safe can collide; those are given a
    hash tail, in manifest-key order, as they always were."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(keys)
    if n < 2 or to_mask(pc.less(keys.slice(0, n - 1), keys.slice(1))).all():
        return keys  # strictly ascending (the manifest's keys, each safe: the usual case) is unique, and cheap to see
    if pc.count_distinct(keys).as_py() == n:
        return keys
    seen: set[str] = set()
    out = []
    for k in keys.to_pylist():
        while k in seen:
            k = shard_key(f"{k}-{hashlib.sha1(k.encode()).hexdigest()[:8]}")
        seen.add(k)
        out.append(k)
    return pa.array(out, pa.string())


def _phashes(hexes, keys) -> tuple[np.ndarray, np.ndarray]:
    """The images' perceptual hashes (16 hex digits) as uint64, and which samples have one."""
    import pyarrow.compute as pc

    n = len(hexes)
    has = to_mask(pc.greater(pc.utf8_length(pc.fill_null(hexes, "")), 0))
    values = np.zeros(n, dtype=np.uint64)
    plain = to_mask(pc.match_substring_regex(hexes, "^[0-9a-fA-F]{16}$"))
    if plain.any():  # the digits of all at once: a table from ASCII to digit value
        from pipeline.shard.plan import values as string_values

        digits = string_values(hexes.filter(_pa_mask(plain)))[1]  # 16 bytes each, one after another
        values[plain] = (_HEX[digits].reshape(-1, 16).astype(np.uint64) << _NIBBLES).sum(axis=1, dtype=np.uint64)
    for i in np.flatnonzero(has & ~plain).tolist():  # written otherwise (a hand-made manifest): as Python reads it
        values[i] = _phash(keys[i].as_py(), hexes[i].as_py())
    return values, has


_HEX = np.zeros(256, dtype=np.uint8)
for _d in "0123456789abcdef":
    _HEX[ord(_d)] = _HEX[ord(_d.upper())] = int(_d, 16)
_NIBBLES = np.arange(60, -1, -4, dtype=np.uint64)


def _phash(key: str, value: str) -> int:
    try:
        h = int(value, 16)
    except ValueError:
        h = -1
    if not 0 <= h < 1 << 64:
        raise UsageError(f"manifest key {key!r} has a phash that is not 16 hex digits ({value!r}): is the manifest from pipe clean?")
    return h


def recorded_pixels(width, height, sums, squares) -> np.ndarray:
    """(n, 8) int64: width, height, 3 sums, 3 sums of squares as pipe clean recorded them, or
    UNRECORDED rows where the manifest has none (a pipe before these columns) or not plausible
    numbers (a hand-made manifest): those images are decoded and measured, as they always were."""
    import pyarrow.compute as pc

    n = len(width)
    out = np.full((n, 8), UNRECORDED, dtype=np.int64)
    ok = to_mask(pc.and_(pc.is_valid(width), pc.is_valid(height)))
    for lists in (sums, squares):
        ok &= to_mask(pc.equal(pc.list_value_length(lists), 3))
    if not ok.any():
        return out
    at = np.flatnonzero(ok)
    got = np.empty((len(at), 8), dtype=np.int64)
    got[:, 0] = pc.fill_null(width, -1).to_numpy(zero_copy_only=False)[at]
    got[:, 1] = pc.fill_null(height, -1).to_numpy(zero_copy_only=False)[at]
    for col, lists in ((2, sums), (5, squares)):
        three = pc.list_flatten(lists.filter(_pa_mask(ok)))
        got[:, col : col + 3] = pc.fill_null(three, -1).to_numpy(zero_copy_only=False).reshape(-1, 3)
    plausible = (got >= 0).all(axis=1)  # no negative and no missing number
    out[at[plausible]] = got[plausible]
    return out


def _pa_mask(mask: np.ndarray):
    import pyarrow as pa

    return pa.array(mask, pa.bool_())


def _json_strings(values):
    """Each string as JSON text, as `encode_meta` writes it (null: "null"): quoted, and escaped
    where it has a quote, a backslash or a control character (rare: those go through Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.any(pc.match_substring_regex(values, r'[\x00-\x1f"\\]')).as_py():
        return pa.array(["null" if v is None else encode_basestring(v) for v in values.to_pylist()], pa.string())
    return pc.fill_null(pc.binary_join_element_wise('"', values, '"', ""), "null")


def _json_numbers(values):
    """Each number as JSON text (null: "null"); floats as Python writes them (repr, NaN, Infinity)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_integer(values.type):
        return pc.fill_null(pc.cast(values, pa.string()), "null")
    return pa.array(["null" if v is None else _float_json(v) for v in values.to_pylist()], pa.string())


def _float_json(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return float.__repr__(v)


def _meta(*, label, manifest_key, width, height, has_image: np.ndarray, image_source, text_source,
          has_text_row: np.ndarray, encoding, confidence):
    """Every sample's .json member, byte for byte what `encode_meta` makes of its dict (keys
    sorted, no spaces, UTF-8 as is), assembled from whole columns:

        {"image":{"height":H,"width":W},"label":L,"manifest_key":K,"sources":{"image":S,"text":T},
         "text":{"encoding":E,"encoding_confidence":C}}

    with "image" and sources.image only for a sample with an image, "manifest_key" only where
    the shard key differs from it, sources.text for any text (a labels-file caption included),
    "text" only for a text with a row of its own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def when(mask: np.ndarray, *parts):
        return pc.if_else(_pa_mask(mask), pc.binary_join_element_wise(*parts, ""), "")

    has_text = to_mask(pc.is_valid(text_source))
    has_key = to_mask(pc.is_valid(manifest_key))
    pieces = [
        when(has_image, '{"image":{"height":', _json_numbers(height), ',"width":', _json_numbers(width), '},"label":'),
        when(~has_image, '{"label":'),
        _json_strings(label),
        when(has_key, ',"manifest_key":', _json_strings(manifest_key)),
        pa.scalar(',"sources":{'),
        when(has_image, '"image":', _json_strings(image_source)),
        when(has_image & has_text, ","),
        when(has_text, '"text":', _json_strings(text_source)),
        pa.scalar("}"),
        when(has_text_row, ',"text":{"encoding":', _json_strings(encoding), ',"encoding_confidence":', _json_numbers(confidence), "}"),
        pa.scalar("}"),
    ]
    return pc.binary_join_element_wise(*pieces, "").cast(pa.binary())
