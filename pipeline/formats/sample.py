"""The shard sample format: one sample <-> its webdataset members, both ways, spelled out only here.

A sample in a shard is consecutive tar members sharing a key (webdataset's convention: a dict of
``__key__`` plus one entry per extension):

* ``{key}.jpg`` / ``.png`` / ``.webp``: the cleaned image, bytes as `pipe clean` wrote them;
* ``{key}.txt``: the caption or text, UTF-8;
* ``{key}.cls``: the class index, ASCII digits (webdataset decodes it to an int); absent for an
  image–caption pair without a class (its ``.json`` label is null): no class index stands in;
* ``{key}.json``: where it came from: sources, label name, original size, text encoding.

Members are always written in that order (`MEMBER_ORDER`). Keys hold only ``[A-Za-z0-9_-]``
(no dots, no separators), at most `MAX_KEY` characters, so every member name fits a plain USTAR
header.

Writing: pipe shard lays out whole shards at once, as arrays (`layout`: which member of the
shard each payload is; `name_rows`: their header names; `encode_class`, `encode_meta`: the
small members' bytes; `sample_bytes`: what a sample takes on disk). Reading: `split_name` is the
one rule that cuts a member name into key and extension, for every reader (the streaming reader,
pipe check, pipe report, pipe labels); `RawSample` is a sample read back, `webdataset_sample`
its webdataset dict; `IMAGE_LIKE` and `TEXT_LIKE` are what a reader takes for an image or a text
in a shard another tool wrote.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, field

import numpy as np

from pipeline.formats import tarstream

IMAGE_EXTS = ("jpg", "png", "webp")
TEXT_EXT, CLASS_EXT, META_EXT = "txt", "cls", "json"
MEMBER_ORDER = (*IMAGE_EXTS, TEXT_EXT, CLASS_EXT, META_EXT)  # every member type pipe shard writes; pipe check fails any other
# what readers take for an image or a text in a shard pipe shard did not write (pipe check judges
# such shards; pipe report previews them): the common extensions besides ours
IMAGE_LIKE = (*IMAGE_EXTS, "jpeg", "ppm", "bmp", "tif", "tiff")
TEXT_LIKE = (TEXT_EXT, "text", "caption")
MAX_KEY = 80
KEY_CHARS = "[A-Za-z0-9_-]"
KEY_PATTERN = f"^{KEY_CHARS}+$"  # a webdataset-safe key, for Arrow over whole columns (RE2: $ is the end of the text)
_SAFE = re.compile(f"{KEY_CHARS}+")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_-]+")


def is_safe_key(key: str) -> bool:
    """Letters, digits, ``_`` and ``-`` only: no dot (it would end the key), no separator, no
    newline (Python's ``$`` would let one end the key)."""
    return _SAFE.fullmatch(key) is not None


def shard_key(key: str) -> str:
    """A key safe for webdataset and short enough for a USTAR name (long ones get a hash tail)."""
    if not is_safe_key(key):
        key = _UNSAFE_RUN.sub("_", key).strip("_") or "x"
    if len(key) <= MAX_KEY:
        return key
    return f"{key[: MAX_KEY - 9]}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


# -- writing: whole shards as arrays ---------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the payloads of n samples written one after another go among the shard's members,
    in `MEMBER_ORDER` (image, text, class, metadata; a sample without an image or a text has no
    such member): member indices, as arrays."""

    firsts: np.ndarray  # int64 (n,): each sample's first member
    image_samples: np.ndarray  # the samples that have an image
    image: np.ndarray  # their image members
    text_samples: np.ndarray  # the samples that have a text
    text: np.ndarray  # their text members
    cls_samples: np.ndarray  # the samples that have a class
    cls: np.ndarray  # their .cls members
    meta: np.ndarray  # every sample's .json member
    count: int  # members in all

    @property
    def per_sample(self) -> np.ndarray:
        """Members of each sample."""
        return np.diff(np.append(self.firsts[: len(self.meta)], self.count))


def layout(has_image: np.ndarray, has_text: np.ndarray, has_class: np.ndarray | None = None) -> Layout:
    """The members of samples with (``has_image``, ``has_text``, ``has_class``: default every
    sample), each sample's in member order."""
    has_image, has_text = np.asarray(has_image, dtype=bool), np.asarray(has_text, dtype=bool)
    always = np.ones(len(has_image), dtype=np.int64)
    has_class = np.ones(len(has_image), dtype=bool) if has_class is None else np.asarray(has_class, dtype=bool)
    present = np.stack([has_image.astype(np.int64), has_text.astype(np.int64), has_class.astype(np.int64), always], axis=1)
    per_sample = present.sum(axis=1)
    firsts = np.concatenate(([0], np.cumsum(per_sample)[:-1])).astype(np.int64)
    at = firsts[: len(has_image), None] + np.cumsum(present, axis=1) - present  # each slot's member index
    with_image, with_text, with_class = np.flatnonzero(has_image), np.flatnonzero(has_text), np.flatnonzero(has_class)
    return Layout(firsts, with_image, at[with_image, 0], with_text, at[with_text, 1], with_class, at[with_class, 2],
                  at[:, 3], int(per_sample.sum()))


def name_rows(key_at: np.ndarray, key_bytes: np.ndarray, lay: Layout, image_exts: np.ndarray) -> np.ndarray:
    """The name field of every member's tar header, ``(lay.count, tarstream.MAX_NAME)`` uint8: the
    sample's key and the member's extension, NUL-padded, placed from the keys' bytes with array
    operations (no str per member). ``key_at``/``key_bytes``: the keys as value offsets (n + 1)
    and their bytes one after another; ``image_exts``: each sample's image extension, an index
    into IMAGE_EXTS (for the samples ``lay`` gives an image)."""
    n_samples = len(key_at) - 1
    key_len = np.diff(key_at)
    if key_len.max(initial=0) + len("." + META_EXT) > tarstream.MAX_NAME:  # (shard keys are capped well below)
        raise ValueError(f"tar member name longer than {tarstream.MAX_NAME} bytes")
    keys = np.zeros((n_samples, tarstream.MAX_NAME), dtype=np.uint8)
    keys[np.repeat(np.arange(n_samples), key_len), np.arange(len(key_bytes)) - np.repeat(key_at[:-1], key_len)] = key_bytes
    rows = keys[np.repeat(np.arange(n_samples), lay.per_sample)]
    exts = np.asarray(image_exts)[lay.image_samples]
    ends = (
        [(lay.image[exts == e], lay.image_samples[exts == e], ext) for e, ext in enumerate(IMAGE_EXTS)]
        + [(lay.text, lay.text_samples, TEXT_EXT), (lay.cls, lay.cls_samples, CLASS_EXT),
           (lay.meta, np.arange(n_samples), META_EXT)])
    for members, samples, ext in ends:
        if len(members):
            suffix = np.frombuffer(f".{ext}".encode(), dtype=np.uint8)
            rows[members[:, None], key_len[samples][:, None] + np.arange(len(suffix))] = suffix
    return rows


def encode_class(cls: int) -> bytes:
    """The .cls member: the class index in ASCII digits."""
    return str(cls).encode("ascii")


def encode_meta(meta: dict) -> bytes:
    """The .json member: keys sorted, no spaces, UTF-8 as is (pipe shard builds these bytes from
    whole columns, `pipeline.shard.samples`, byte for byte this)."""
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sample_bytes(image_size: np.ndarray, text_size: np.ndarray, cls_size: np.ndarray, meta_size: np.ndarray) -> np.ndarray:
    """Bytes each sample takes in a shard (headers, data, padding) from its members' sizes (an
    image, text or class size below 0: the sample has none)."""
    n = tarstream.member_sizes(meta_size) + np.where(np.asarray(cls_size) >= 0, tarstream.member_sizes(cls_size), 0)
    n += np.where(np.asarray(image_size) >= 0, tarstream.member_sizes(image_size), 0)
    n += np.where(np.asarray(text_size) >= 0, tarstream.member_sizes(text_size), 0)
    return n


# -- reading ------------------------------------------------------------------------------------


# webdataset's `base_plus_ext`, the expression itself: whatever stock webdataset groups, we group alike
_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def split_name(name: str) -> tuple[str, str]:
    """``key.ext`` -> (key, ext), webdataset's rule: the key ends at the first dot of the basename
    (a folder before it stays in the key), the extension is all after that dot (``a.b.c`` ->
    ``a``, ``b.c``). ValueError for a name webdataset puts in no sample: no dot in the basename,
    or nothing before it (``.jpg``; webdataset's expression then lets the key reach back over a
    folder without dots: ``a/.jpg`` is key ``a/``, and so it is here)."""
    if "/" not in name:  # every name pipe shard writes: the expression's answer, without running it
        dot = name.find(".")
        if dot > 0:
            return name[:dot], name[dot + 1 :]
    match = _NAME.match(name)
    if match is None:
        why = "no extension" if "." not in name.rpartition("/")[2] else "no key before its extension"
        raise ValueError(f"tar member {name!r} has {why}")
    key, ext = match.group(1, 2)
    return key, ext


def member_name(key: str, ext: str) -> str:
    """The name of a sample's member: what `split_name` cuts back into (key, ext)."""
    return f"{key}.{ext}"


@dataclass
class RawSample:
    """One sample as read back from a shard: its key and member bytes by extension (reader side).

    The reader's fields are memoryviews into the block it read (no copy per member): use
    ``bytes(...)`` to keep one beyond the batch or to call ``bytes`` methods on it.
    """

    key: str
    fields: dict[str, bytes | memoryview] = field(default_factory=dict)
    shard: str = ""
    offset: int = 0  # byte offset of the first member in the shard

    @property
    def image_ext(self) -> str | None:
        return next((e for e in IMAGE_EXTS if e in self.fields), None)

    def webdataset_sample(self) -> dict:
        """The sample as stock webdataset yields it: ``{"__key__": key, ext: bytes, ...}``."""
        return {"__key__": self.key, **{ext: bytes(data) for ext, data in self.fields.items()}}


class DecodeError(ValueError):
    """A member of a sample could not be decoded."""


def decode_image(data: bytes | memoryview, ext: str, out: np.ndarray | None = None) -> np.ndarray:
    """An HxWx3 uint8 RGB array. JPEG through libjpeg-turbo (simplejpeg); others through Pillow.

    ``out``: an HxWx3 uint8 array that a JPEG of exactly that size is decoded into (and
    returned), saving a new array per image; any other image comes back in a new array.
    """
    try:
        if ext == "jpg":
            import simplejpeg

            if out is not None and simplejpeg.decode_jpeg_header(data)[:2] == out.shape[:2] and out.shape[2:] == (3,):
                return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, buffer=out)
            return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
        from PIL import Image

        with Image.open(io.BytesIO(bytes(data))) as im:
            im.load()
            return np.asarray(im.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - every decoder failure becomes one kind of error
        raise DecodeError(f"{ext} image does not decode: {type(e).__name__}: {e}") from None


def decode_class(data: bytes | memoryview) -> int:
    try:
        return int(bytes(data).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise DecodeError(f"cls member is not an integer: {bytes(data)[:20]!r}") from None
