"""One image file in, one verdict out: a quarantine reason, or the cleaned output image.

`clean_image` is what a worker runs for every image: decode (`decode.py`: structure, header
limits, full strict decode, colour, orientation), then the exact-duplicate key (a hash of the
decoded pixels, so one picture in PNG, BMP or lossless WebP is one key), the resize
(`resize.fit_and_picture`), the perceptual hash of the whole picture (taken from its scaled
copy where the resize made one) and the encode. Every failure ends as a reason from the fixed
vocabulary with a readable detail; no exception escapes.

The decoded pixels that are hashed are those of the upright RGB image the output is made from.
For a JPEG that may already be shrunk in the DCT domain (see `resize.dct_scale`), so the key
of a JPEG matches other JPEGs with the same coefficients (a copy with its metadata stripped, a
lossless re-encode) but not a PNG of its full-size pixels: that pair is left to near-duplicate
detection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.formats.pixels import ImagePixels
from pipeline.formats.vocabulary import Reason
from pipeline.media.image.window import AUTO, Window

BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128), "gray": (128, 128, 128)}


@dataclass(frozen=True)
class ImageSettings:
    size: int = 512
    resize_mode: str = "pad"
    format: str = "jpg"
    quality: int = 90
    min_size: int = 32
    max_pixels: int = 178_956_970
    background: tuple[int, int, int] = (255, 255, 255)
    window: Window = AUTO  # --window: how more than 8 bits a sample become 8


@dataclass
class ImageOutcome:
    reason: Reason | None = None
    detail: str = ""
    width: int | None = None
    height: int | None = None
    content_hash: str | None = None
    phash: int | None = None
    data: bytes | None = None  # the encoded output image
    ext: str = ""
    # the output's size and pixel sums, of the pixels encoded (for PNG those a reader decodes;
    # for JPEG and WebP those before the lossy encode: `_measure`)
    output_pixels: ImagePixels | None = None
    notes: list[str] = field(default_factory=list)


def preload() -> None:
    """Import the decoders and the resizer (numpy, Pillow, libjpeg-turbo, fast_image_resize):
    done once per worker at start-up. The main process never needs them, so `pipe clean`
    itself starts fast. And keep the memory the worker frees (`keep_freed_memory`)."""
    import cykooz_resizer  # noqa: F401

    import pipeline.media.image.decode  # noqa: F401
    import pipeline.similarity.perceptual  # noqa: F401

    keep_freed_memory()


# an image's buffers up to this size come from the heap and go back to it (glibc's defaults
# start at 128 KiB and move; the heap's top is handed back to the system past twice as much)
HEAP_BLOCKS = 16 << 20


def keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory an image's buffers are freed to, for the next image.

    Each image allocates and frees the same few large buffers (the decoded picture, its array,
    the resized and padded copies, the input's bytes: ~8 MiB for a 2048x1536 JPEG). With glibc's
    moving thresholds they went back to the system and came again as fresh pages: ~2,000 page
    faults an image, each a zeroed page, ~4 ms of a worker's ~17 ms of CPU per camera JPEG
    (measured in one process, load ~8; none with the fixed thresholds). Elsewhere (another C
    library): nothing. A worker then holds up to twice `HEAP_BLOCKS` it is not using."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
        libc.mallopt(m_mmap_threshold, HEAP_BLOCKS)
        libc.mallopt(m_trim_threshold, 2 * HEAP_BLOCKS)
    except (OSError, AttributeError):
        pass


def clean_image(data: bytes, s: ImageSettings) -> ImageOutcome:
    from pipeline.media.image.decode import Decoded, Target, decode
    from pipeline.media.image.resize import fit_and_picture
    from pipeline.media.reject import Reject
    from pipeline.similarity.perceptual import phash

    out = ImageOutcome()
    d = Decoded()
    try:
        decode(data, Target(s.size, s.resize_mode, s.min_size, s.max_pixels, s.background, s.window), d)
    except Reject as r:
        out.reason, out.detail = r.reason, r.detail
    except MemoryError:
        out.reason, out.detail = Reason.DECOMPRESSION_BOMB, "ran out of memory while decoding"
    except Exception as e:  # noqa: BLE001 - a decoder bug on hostile input is a verdict, not a crash
        out.reason, out.detail = Reason.CORRUPT, f"decoder failed: {type(e).__name__}: {e}"
    out.width, out.height = d.width or None, d.height or None
    out.notes = list(dict.fromkeys(d.notes))  # each note once, in order
    if out.reason is not None:
        return out
    # a JPEG's pixels as decoded (an array; its Pillow image is made only if asked for), or the image
    rgb = d.pixels if d.pixels is not None else d.image
    if rgb is None:  # decode either sets the image or raises
        raise AssertionError("the decoder returned without an image or a reason")
    out.content_hash = pixel_hash(rgb)
    final, picture = fit_and_picture(rgb, s.size, s.resize_mode, s.background)
    shown = picture if picture is not None else final  # the picture as output, without padding
    hist = shown.histogram()  # one pass, for the blank test and the output's pixel sums
    blank = _blank(shown, d.depth, hist)
    if blank:
        out.reason, out.detail = Reason.BLANK_IMAGE, blank
        return out
    # the hash squeezes the picture to 32x32: from the scaled picture it is the same hash at a
    # third of the cost of hashing the decoded one
    whole = picture if picture is not None else d.image  # (crop: the whole picture was not resampled)
    if whole is None:
        raise AssertionError("the decoder returned pixels without an image")
    out.phash = phash(whole)
    out.data, out.ext = encode(final, s.format, s.quality), s.format
    out.output_pixels = _measure(final, shown, hist, s.background)
    return out


def _measure(final, shown=None, hist: list[int] | None = None, background=(0, 0, 0)) -> ImagePixels:
    """Size and exact pixel sums of the RGB output image in hand, before it is encoded.

    ``shown``, ``hist``: the part of ``final`` that shows the picture (`fit_and_picture`'s
    picture: all of it, or the scaled picture that padding put on a canvas of ``background``)
    and its histogram, already taken for the blank test; the padding's pixels are added to it
    rather than counting every output pixel again. Measured before the encode, not from the
    file decoded again (issue 26): for a lossy output the numbers differ from a reader's by
    what the encode changed (pipe shard's mean by under 2e-4, its std by under 1.4%, on the
    0-1 scale; README), for a decode less per image (~1.5 ms at 512 px, 2 ms of a small image's ~7)."""
    from pipeline.formats.pixels import histogram_sums

    if final.mode != "RGB" or (shown is not None and shown.mode != "RGB"):
        raise AssertionError(f"the output image is {final.mode}, not RGB")
    if shown is None or hist is None:
        shown, hist = final, final.histogram()
    if shown is not final:  # padding: a canvas of the background colour around the picture
        bars = final.width * final.height - shown.width * shown.height
        hist = list(hist)
        for c in range(3):
            hist[256 * c + background[c]] += bars
    sums, squares = histogram_sums(hist)
    return ImagePixels(final.width, final.height, sums, squares)


def _blank(picture, depth=None, hist: list[int] | None = None) -> str:
    """Why the picture as output (before padding) has (almost) no information, or "".

    A flat image teaches a model nothing, and every flat image of one colour is an exact
    duplicate of every other, under whatever label: quarantined, never kept. Transparency has had
    its chance first (`colour.to_rgb` puts artwork the background would erase on a contrasting
    colour), so what is flat here is flat on any background. ``depth`` (`depth.Scaled`): how a
    source of more than 8 bits a sample was made 8-bit, so the detail says whether the source
    itself is flat or only its scaled copy. ``hist``: the picture's histogram, when taken already."""
    from PIL import ImageStat

    from pipeline.media.image.colour import FLAT_STD, flat

    if not flat(picture, hist):
        return ""
    st = ImageStat.Stat(picture)
    colour = "#" + "".join(f"{round(v):02x}" for v in st.mean)
    if depth is not None:
        from pipeline.media.image.depth import blank_detail

        return blank_detail(depth, colour, FLAT_STD)
    return (f"the cleaned image is one flat colour ({colour}, no channel varies by {FLAT_STD:g} level or more): "
            "nothing to learn from it")


def pixel_hash(rgb) -> str:
    """Exact-duplicate key: xxh3-128 of the size and the RGB bytes of an RGB image, or of its
    pixels as an (H, W, 3) uint8 array (hashed as they are, without a copy)."""
    import numpy as np
    import xxhash

    h = xxhash.xxh3_128()
    if isinstance(rgb, np.ndarray):
        h.update(f"{rgb.shape[1]}x{rgb.shape[0]}".encode())
        h.update(rgb.data if rgb.flags.c_contiguous else rgb.tobytes())
    else:
        h.update(f"{rgb.width}x{rgb.height}".encode())
        h.update(rgb.tobytes())
    return h.hexdigest()


def encode(im, fmt: str, quality: int) -> bytes:
    import io

    buf = io.BytesIO()
    if fmt == "jpg":
        im.save(buf, "JPEG", quality=quality, optimize=False)
    elif fmt == "png":
        im.save(buf, "PNG", compress_level=6)
    else:
        im.save(buf, "WEBP", quality=quality, method=4)
    return buf.getvalue()
