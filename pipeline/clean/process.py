"""The per-file function the workers run: read one input once, judge it, write its cleaned
output, and return a `FileResult`. Pure with respect to its input file and settings, so results
can be journaled and reused on resume.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pipeline.clean.candidate import Candidate
from pipeline.clean.records import FileResult
from pipeline.formats.pixels import ImagePixels
from pipeline.formats.vocabulary import Kind, Reason
from pipeline.media.image.clean import ImageSettings
from pipeline.media.text.clean import TextSettings
from pipeline.storage import Folder

HASH_CHUNK = 1 << 20
_SETTINGS: WorkerSettings | None = None  # set once per worker process by init_worker


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker needs to know (pickled to it once, at start-up)."""

    output: Folder  # CLEAN_DIR, wherever it is: outputs are written through it
    image: ImageSettings
    text: TextSettings
    input: Folder  # INPUT: a candidate's ``path`` is where in it its bytes are read


def init_worker(settings: WorkerSettings) -> None:
    global _SETTINGS
    _SETTINGS = settings
    from pipeline.media.image.clean import preload

    preload()


def output_path(source: str, key: str, ext: str) -> str:
    """Where a kept file goes, relative to CLEAN_DIR: its folder mirrored under data/."""
    folder = source.rpartition("/")[0]
    return f"data/{folder}/{key}.{ext}" if folder else f"data/{key}.{ext}"


def process(cand: Candidate, settings: WorkerSettings | None = None) -> FileResult:
    s = settings or _SETTINGS
    if s is None:
        raise AssertionError("process() runs in a pool that init_worker set up, or is given its settings")
    r = FileResult(source=cand.source, key=cand.key, kind=cand.kind, label=cand.label)
    if cand.problem:
        r.reason, r.detail = cand.problem, cand.detail
        return r
    try:
        with s.input.open(cand.path) as f:
            st = f.stat()
            r.bytes, r.mtime_ns, r.ctime_ns = st.st_size, st.st_mtime_ns, st.st_ctime_ns
            too_large = cand.kind == Kind.TEXT and st.st_size > s.text.max_bytes
            if cand.kind == Kind.OTHER or too_large:  # hashed in chunks, never read whole
                r.sha256 = _hash_stream(f)
                data = b""
            else:
                data = f.read()
                r.sha256 = hashlib.sha256(data).hexdigest()
    except OSError as e:
        r.reason, r.detail = Reason.UNREADABLE, f"{type(e).__name__}: {e.strerror or e}"
        return r
    if r.bytes == 0:
        r.reason, r.detail = Reason.ZERO_BYTES, "the file is empty"
        return r
    if too_large:
        r.reason, r.detail = Reason.TOO_LARGE, f"{r.bytes} bytes > --max-text-bytes {s.text.max_bytes} (not read)"
        return r
    if cand.kind == Kind.OTHER:
        r.reason, r.detail = Reason.UNSUPPORTED_FORMAT, f"{cand.fmt}: not an image or a text"
        return r
    payload, px = None, None
    try:
        payload, ext, px = (_image if cand.kind == Kind.IMAGE else _text)(r, data, s)
    except MemoryError:
        r.reason, r.detail = Reason.DECOMPRESSION_BOMB, "ran out of memory while decoding"
    except Exception as e:  # noqa: BLE001 - a decoder bug on hostile input is a verdict, not a crash
        r.reason, r.detail = Reason.CORRUPT, f"decoder failed: {type(e).__name__}: {e}"
    if payload is not None and r.reason is None:
        # outside the try: failing to write our own output (disk full) stops the run, it is no verdict
        r.output = output_path(r.source, r.key, ext)
        s.output.write(r.output, payload)
        r.output_bytes = len(payload)
        if px is not None:  # an image's output
            _measure_output(r, px)
    return r


def _measure_output(r: FileResult, px: ImagePixels) -> None:
    """Record the written image's size and pixel sums, so pipe shard need not decode it: taken
    from the pixels in hand before they were encoded (`clean_image` gives them for every output:
    exact for a lossless format; for a lossy one they differ from a reader's decode by what the
    encode changed, which the manifest says: `pipeline.formats.pixels.MANIFEST_KEY`)."""
    r.output_width, r.output_height = px.width, px.height
    r.pixel_sums, r.pixel_squares = list(px.sums), list(px.squares)


def _hash_stream(f) -> str:
    h = hashlib.sha256()
    while chunk := f.read(HASH_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _image(r: FileResult, data: bytes, s) -> tuple[bytes | None, str, ImagePixels | None]:
    from pipeline.media.image.clean import clean_image

    o = clean_image(data, s.image)
    r.width, r.height, r.notes = o.width, o.height, o.notes
    r.reason, r.detail = o.reason, o.detail
    r.content_hash, r.phash = o.content_hash, o.phash
    return o.data, o.ext, o.output_pixels


def _text(r: FileResult, data: bytes, s) -> tuple[bytes | None, str, None]:
    from pipeline.media.text.clean import clean_text

    o = clean_text(data, s.text)
    r.encoding, r.encoding_confidence, r.notes = o.encoding, o.confidence, o.notes
    r.reason, r.detail = o.reason, o.detail
    r.content_hash, r.minhash = o.content_hash, o.minhash
    return (o.text.encode("utf-8") if o.text is not None else None), "txt", None


def crashed(inp: Folder, cand: Candidate, exc: BaseException) -> FileResult:
    """The result for a file whose decoder killed its worker process twice (``inp``: INPUT)."""
    r = _stat_only(inp, cand)
    r.reason, r.detail = Reason.UNREADABLE, "the decoder crashed the worker process on this file (twice)"
    return r


def timed_out(inp: Folder, cand: Candidate, seconds: float) -> FileResult:
    """The result for a file that held its worker longer than --file-timeout (``inp``: INPUT)."""
    r = _stat_only(inp, cand)
    r.reason, r.detail = Reason.TIMEOUT, f"still not done after {seconds:g} s (--file-timeout); the worker was stopped"
    return r


def _stat_only(inp: Folder, cand: Candidate) -> FileResult:
    r = FileResult(source=cand.source, key=cand.key, kind=cand.kind, label=cand.label)
    try:
        with inp.open(cand.path) as f:
            st = f.stat()
            r.bytes, r.mtime_ns, r.ctime_ns = st.st_size, st.st_mtime_ns, st.st_ctime_ns
            r.sha256 = _hash_stream(f)
    except OSError:
        pass
    return r
