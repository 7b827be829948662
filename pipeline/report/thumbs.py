"""Small previews of files for the page, through our own safe decoder and its limits.

A preview is a 96 px JPEG as a ``data:`` URI, or a `Thumb` without one that says why (the file
is missing, changed, outside its folder, too big to read, a decompression bomb, will not decode,
is not an image). Files are read only inside the folder the caller names (`fetch`).
Nothing here raises on a bad file: a report about broken data must survive the broken data.
The JPEG encoder is deterministic, so the same inputs give the same page bytes.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
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
GONE = "no preview: file not found"
EMPTY = "no preview: empty file"
CHANGED = "no preview: the file changed since pipe clean read it"
OUTSIDE = "no preview: not a file inside its folder"
NO_INPUT = "no preview: only in the input folder (give it with --input)"


@dataclass(frozen=True)
class Thumb:
    """A preview: ``uri`` is a data: URI, or empty with ``why`` saying why there is none."""

    uri: str = ""
    why: str = ""


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


def fetch(folder: Folder | None, rel: str | None, sha256: str | None = None, head: int | None = None) -> bytes | Thumb:
    """The bytes of a file to preview, or a `Thumb` saying why there are none. Read only if the
    file is a regular file inside ``folder`` once opened (`Folder.read_contained`: no path or link
    leads out); with ``sha256``, only if its bytes are still those (an input folder that moved or
    changed shows "changed", never another file's content); else ``head``: only the first bytes."""
    from pipeline.storage import TooLarge

    if folder is None or not rel:
        return Thumb(why="no preview: file not available")
    try:
        if head is not None and sha256 is None:
            data = folder.read_contained(rel, head=head)
        else:
            data = folder.read_contained(rel, max_bytes=MAX_FILE_BYTES)
    except TooLarge as e:
        return Thumb(why=f"no preview: file of {e.size} bytes" if e.size is not None else "no preview: file too large")
    except FileNotFoundError:
        return Thumb(why=GONE)
    except PermissionError:
        return Thumb(why=OUTSIDE)
    except (OSError, ValueError, UsageError, StageFailed) as e:
        return Thumb(why=f"no preview: {type(e).__name__}")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        return Thumb(why=CHANGED)
    return data


SNIPPET_BYTES = 160 * 4


def snippet(data: bytes, chars: int = 160) -> str:
    """The first ``chars`` characters of a text file's bytes (UTF-8, bad bytes kept as escapes)."""
    head = data[: chars * 4]
    # a character cut where the read stopped is held back, not shown as bad bytes
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode(head, final=len(data) <= chars * 4)
    return text[:chars]
