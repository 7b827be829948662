"""Small previews of files for the page, through our own safe decoder and its limits.

A preview is a 96 px JPEG as a ``data:`` URI, or a `Placeholder` that says why there is none
(the file is missing, too big to read, a decompression bomb, will not decode, is not an image).
Nothing here raises on a bad file: a report about broken data must survive the broken data.
The JPEG encoder is deterministic, so the same inputs give the same page bytes.
"""

from __future__ import annotations

import base64
import codecs
import io
from dataclasses import dataclass
from pathlib import Path

SIZE = 96
QUALITY = 70
MAX_FILE_BYTES = 64 * 2**20  # a bigger file is not read for a preview
MAX_PIXELS = 64_000_000  # tighter than pipe clean's default: a preview must stay quick


@dataclass(frozen=True)
class Thumb:
    """A preview: ``uri`` is a data: URI, or empty with ``why`` saying why there is none."""

    uri: str = ""
    why: str = ""


def image(path: Path | None, root: Path | None = None) -> Thumb:
    """The preview of one image file; ``root``: the folder the path must stay inside."""
    data = _read(path, root)
    if isinstance(data, Thumb):
        return data
    return from_bytes(data)


def from_bytes(data: bytes) -> Thumb:
    from PIL import Image

    from pipeline.media.image.decode import Target, decode
    from pipeline.media.reject import Reject

    try:
        d = decode(data, Target(size=SIZE, mode="pad", min_size=1, max_pixels=MAX_PIXELS))
    except Reject as e:
        return Thumb(why=f"no preview: {e.reason}")
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises, the page goes on
        return Thumb(why=f"no preview: {type(e).__name__}")
    if d.image is None:  # decode returns only once it has set the image
        return Thumb(why="no preview: nothing decoded")
    im = d.image.copy()
    im.thumbnail((SIZE, SIZE), Image.Resampling.BILINEAR, reducing_gap=None)
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "JPEG", quality=QUALITY, optimize=False, progressive=False)
    return Thumb(uri="data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))


def _read(path: Path | None, root: Path | None) -> bytes | Thumb:
    if path is None:
        return Thumb(why="no preview: file not available")
    try:
        if root is not None and root.resolve() not in path.resolve().parents:
            return Thumb(why="no preview: path leaves its folder")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return Thumb(why=f"no preview: file of {size} bytes")
        if size == 0:
            return Thumb(why="no preview: empty file")
        return path.read_bytes()
    except FileNotFoundError:
        return Thumb(why="no preview: file not found")
    except (OSError, ValueError) as e:
        return Thumb(why=f"no preview: {type(e).__name__}")


def text_snippet(path: Path | None, root: Path | None = None, chars: int = 160) -> str | None:
    """The first ``chars`` characters of a text file (UTF-8, bad bytes kept as escapes), or None."""
    if path is None:
        return None
    try:
        if root is not None and root.resolve() not in path.resolve().parents:
            return None
        with open(path, "rb") as f:
            head = f.read(chars * 4)
    except (OSError, ValueError):
        return None
    # a character cut where the read stopped is held back, not shown as bad bytes
    cut = len(head) == chars * 4
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(head, final=not cut)
    return text[:chars]
