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
from typing import TYPE_CHECKING

from pipeline.core.errors import StageFailed, UsageError

if TYPE_CHECKING:
    from pipeline.storage import Folder

SIZE = 96
QUALITY = 70
MAX_FILE_BYTES = 64 * 2**20  # a bigger file is not read for a preview
MAX_PIXELS = 64_000_000  # tighter than pipe clean's default: a preview must stay quick


@dataclass(frozen=True)
class Thumb:
    """A preview: ``uri`` is a data: URI, or empty with ``why`` saying why there is none."""

    uri: str = ""
    why: str = ""


def image(folder: Folder | None, rel: str | None = None) -> Thumb:
    """The preview of one image file, read through its folder (a path leaving it shows none)."""
    data = _read(folder, rel)
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


def _read(folder: Folder | None, rel: str | None) -> bytes | Thumb:
    from pipeline.storage import TooLarge

    if folder is None or not rel:
        return Thumb(why="no preview: file not available")
    try:
        if not folder.contained(rel):
            return Thumb(why="no preview: path leaves its folder")
        data = folder.read(rel, max_bytes=MAX_FILE_BYTES)
        if not data:
            return Thumb(why="no preview: empty file")
        return data
    except TooLarge as e:
        return Thumb(why=f"no preview: file of {e.size} bytes")
    except FileNotFoundError:
        return Thumb(why="no preview: file not found")
    except (OSError, ValueError, UsageError, StageFailed) as e:
        return Thumb(why=f"no preview: {type(e).__name__}")


def text_snippet(folder: Folder | None, rel: str | None = None, chars: int = 160) -> str | None:
    """The first ``chars`` characters of a text file (UTF-8, bad bytes kept as escapes), or None."""
    if folder is None or not rel:
        return None
    try:
        if not folder.contained(rel):
            return None
        head = folder.read_range(rel, 0, chars * 4)
    except (OSError, ValueError, UsageError, StageFailed):
        return None
    # a character cut where the read stopped is held back, not shown as bad bytes
    cut = len(head) == chars * 4
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(head, final=not cut)
    return text[:chars]
