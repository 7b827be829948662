"""One sample <-> its webdataset members, the only place either direction is spelled out.

A sample in a shard is consecutive tar members sharing a key (webdataset's convention: a dict of
``__key__`` plus one entry per extension):

* ``{key}.jpg`` / ``.png`` / ``.webp``: the cleaned image, bytes as `pipe clean` wrote them;
* ``{key}.txt``: the caption or text, UTF-8;
* ``{key}.cls``: the class index, ASCII digits (webdataset decodes it to an int);
* ``{key}.json``: where it came from: sources, label name, original size, text encoding.

Members are always written in that order. Keys hold only ``[A-Za-z0-9_-]`` (no dots, no
separators), at most `MAX_KEY` characters, so every member name fits a plain USTAR header.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, field

import numpy as np

IMAGE_EXTS = ("jpg", "png", "webp")
MEMBER_ORDER = (*IMAGE_EXTS, "txt", "cls", "json")  # every member type pipe shard writes; pipe check fails any other
MAX_KEY = 80
_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def shard_key(key: str) -> str:
    """A key safe for webdataset and short enough for a USTAR name (long ones get a hash tail)."""
    if not _SAFE.match(key):
        key = re.sub(r"[^A-Za-z0-9_-]+", "_", key).strip("_") or "x"
    if len(key) <= MAX_KEY:
        return key
    return f"{key[: MAX_KEY - 9]}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


@dataclass
class SampleParts:
    """The payloads of one sample, ready to become members (writer side)."""

    key: str
    cls: int
    meta: dict | bytes  # bytes: already encoded by `encode_meta`
    image: bytes | None = None
    image_ext: str | None = None
    text: bytes | None = None

    def members(self) -> list[tuple[str, bytes]]:
        out = []
        if self.image is not None:
            out.append((f"{self.key}.{self.image_ext}", self.image))
        if self.text is not None:
            out.append((f"{self.key}.txt", self.text))
        out.append((f"{self.key}.cls", str(self.cls).encode("ascii")))
        out.append((f"{self.key}.json", self.meta if isinstance(self.meta, bytes) else encode_meta(self.meta)))
        return out


def encode_meta(meta: dict) -> bytes:
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


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


def split_name(name: str) -> tuple[str, str]:
    """``key.ext`` -> (key, ext), webdataset's rule: the key ends at the first dot of the basename."""
    base = name.rsplit("/", 1)[-1]
    key, dot, ext = base.partition(".")
    if not dot:
        raise ValueError(f"tar member {name!r} has no extension")
    return key, ext


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
