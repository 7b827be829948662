"""What the train split's mean and std are made of: one image's size and exact per-channel pixel
sums, taken from the pixels a reader decodes from the image file.

`pipe clean` measures each output image it writes from the pixels it encodes (a lossy JPEG or
WebP as it was before encoding: within 2e-4 of a reader's mean and 1.4% of its std (bench/pixel_stats.py) on the 0-1
scale, measured; the manifest says so, `MANIFEST_KEY`) and records the numbers in the manifest;
`pipe shard` adds up the train images' numbers instead of decoding every image again, and
decodes (`measure`) only the images a manifest has no numbers for.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a manifest's pixel sums are of, in its Parquet key-value metadata (issue 26): a manifest
# pipe clean writes says BEFORE_ENCODING (JPEG and WebP outputs are measured from the pixels it
# encoded, not decoded again: one decode less an image; PNG's are the same either way); one
# without the key (an older pipe clean, a hand-made file) holds the decoded outputs' sums.
# pipe shard's index.json says which its mean and std come from (`INDEX_FIELD`).
MANIFEST_KEY = b"pipe.pixel_sums"
BEFORE_ENCODING = "before_encoding"
INDEX_FIELD = "pixel_stats"  # index.json: BEFORE_ENCODING, or absent (the decoded images', exact)
LOSSY_EXTS = ("jpg", "webp")  # outputs whose decoded pixels are not those encoded


@dataclass(frozen=True)
class ImagePixels:
    """One decoded image: its size and the exact per-channel (R, G, B) sums of its 0-255 values
    and of their squares (Python ints: no rounding, whatever the image count)."""

    width: int
    height: int
    sums: tuple[int, int, int]
    squares: tuple[int, int, int]

    @property
    def count(self) -> int:
        return self.width * self.height


def measure(data: bytes | memoryview, ext: str) -> ImagePixels:
    """Decode an image file's bytes as readers do (`decode_image`) and measure its pixels.
    Raises `pipeline.formats.sample.DecodeError` when the bytes do not decode."""
    from pipeline.formats.sample import decode_image

    arr = decode_image(data, ext)
    sums, squares = channel_sums(arr)
    return ImagePixels(int(arr.shape[1]), int(arr.shape[0]), sums, squares)


def channel_sums(arr) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Exact per-channel sums and sums of squares of an HxWx3 uint8 array.

    Counted through a 256-bin histogram per channel rather than by squaring every value in 64
    bits: the same integers, several times faster (this runs once per image in `pipe clean`).
    Pillow's histogram counts all three channels in one pass over the interleaved bytes, ~10x
    cheaper than a `np.bincount` per channel (each a strided pass)."""
    import numpy as np
    from PIL import Image

    pixels = np.ascontiguousarray(arr)
    height, width = pixels.shape[:2]
    im = Image.frombuffer("RGB", (width, height), pixels, "raw", "RGB", 0, 1)
    return histogram_sums(im.histogram())


def histogram_sums(hist: list[int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Per-channel sums and sums of squares from an RGB image's 768-bin histogram (Pillow's
    layout: 256 bins of R, then G, then B), as exact Python ints."""
    import numpy as np

    counts = np.asarray(hist, dtype=np.int64).reshape(3, 256)
    values = np.arange(256, dtype=np.int64)
    sums = counts @ values  # at most 8192^2 * 255 * 255 per channel: far inside int64
    squares = counts @ (values * values)
    return tuple(int(v) for v in sums), tuple(int(v) for v in squares)  # type: ignore[return-value]
