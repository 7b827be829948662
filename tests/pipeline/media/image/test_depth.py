"""More than 8 bits a sample -> 8 bits from the range the samples use: 10-, 12-, 14-bit content in
a 16-bit file keeps its levels, what the file declares is honoured where the pixels agree, a flat
result says whether the source itself is flat, and ``--window`` picks another range."""

import numpy as np
import pytest

from pipeline.formats.vocabulary import Reason
from pipeline.media.image.clean import ImageSettings, clean_image
from pipeline.media.image.decode import Target, decode
from pipeline.media.image.depth import Declared, to_8bit
from pipeline.media.image.window import AUTO, Window, parse_window
from tests import nasty
from tests.tiffs import DOUBLE, SHORT, tiff


def ramp(top: int, dtype=np.uint16, width: int = 256) -> np.ndarray:
    return np.tile(np.linspace(0, top, width).round().astype(dtype), (32, 1))


def grey_of(data: bytes, window: Window = AUTO, background=(255, 255, 255)) -> tuple[np.ndarray, list[str]]:
    d = decode(data, Target(size=4096, min_size=1, window=window, background=background))
    out = np.asarray(d.image).astype(int)
    return out, d.notes


def scaled(values, declared=None, window=AUTO):
    notes: list[str] = []
    out, s = to_8bit(np.asarray(values), declared or Declared(), window, "16-bit grey", notes)
    return out.astype(int), s, notes


@pytest.mark.parametrize("bits", range(9, 17))
def test_content_of_n_bits_in_16_uses_every_level(bits):
    # the camera's bits, whatever they are, end up as 0-255: not 0-15 (12 bits) or 0-3 (10 bits)
    out, s, notes = scaled(ramp(2**bits - 1))
    assert out.min() == 0 and out.max() == 255 and len(np.unique(out)) == 256
    assert (s.lo, s.hi) == (0, 2**bits - 1) and f"rounded up to {bits} bits" in s.why
    assert notes == [s.note()] and f"values 0 to {2**bits - 1}" in s.note()


def test_the_maximum_is_rounded_up_to_whole_bits_and_never_below_8():
    assert scaled(ramp(3000))[1].hi == 4095  # 12 bits
    assert scaled(ramp(4096))[1].hi == 8191  # one more level is one more bit
    out, s, _ = scaled(ramp(200))  # a 16-bit file holding 8-bit values: the 8-bit image as it is
    assert s.hi == 255 and np.array_equal(out, ramp(200).astype(int))


def test_full_is_the_whole_16_bit_range_as_before():
    v = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    out, s, _ = scaled(v[:, :], window=Window("full"))
    assert (s.lo, s.hi) == (0, 65535)
    assert np.array_equal(out, np.rint(v.astype(np.float32) / 257.0).astype(int))  # what pipe did
    assert scaled(ramp(4095), window=Window("full"))[0].max() == 16  # 12-bit content in 16 of 256 levels


def test_percentile_window_clips_and_stretches():
    v = ramp(1000)
    v[0, 0] = 60000  # a hot pixel
    out, s, _ = scaled(v, window=parse_window("1,99"))
    assert (s.lo, s.hi) == tuple(np.percentile(v, [1, 99])) and "1th to 99th percentile" in s.why
    assert out.min() == 0 and out.max() == 255 and out[0, 0] == 255 and len(np.unique(out)) > 200
    # percentiles that meet (a mask, most pixels one value) widen to the minimum and maximum
    mask = np.zeros((32, 256), np.uint16)
    mask[:2, :2] = 900
    out, s, _ = scaled(mask, window=parse_window("5,95"))
    assert (s.lo, s.hi) == (0, 900) and out.max() == 255


def test_png_sbit_right_aligned_is_its_range_and_left_aligned_is_the_whole():
    sbit = [nasty.png_chunk(b"sBIT", bytes([12]))]
    out, notes = grey_of(nasty.png(ramp(4095), 0, 16, extra=sbit))
    assert out.max() == 255 and "12 significant bits, as its PNG sBIT says" in notes[-1]
    dim = ramp(1000)  # 12 significant bits, but the image is dim: its sBIT says 0-4095, not 0-1023
    out, notes = grey_of(nasty.png(dim, 0, 16, extra=sbit))
    assert out.max() == round(1000 * 255 / 4095)
    shifted = ramp(4095) << 4  # as the PNG specification writes 12 bits in 16: scaled up
    out, notes = grey_of(nasty.png(shifted, 0, 16, extra=sbit))
    assert out.max() == 255 and "scaled up to 16 bits" in notes[-1]


def test_tiff_declared_sample_range_is_honoured_when_the_pixels_agree():
    # a detector that writes 0-1000 and says so in SMaxSampleValue (or MaxSampleValue)
    for tag in (341, 281):
        out, notes = grey_of(tiff(ramp(1000), tags={tag: (SHORT, (1000,))}))
        assert out.max() == 255 and "declares" in notes[-1], notes
    out, notes = grey_of(tiff(ramp(1000) + 100, tags={340: (SHORT, (100,)), 341: (SHORT, (1100,))}))
    assert out.min() == 0 and out.max() == 255
    # MaxSampleValue 65535 at 16 bits is the type's own range: it says nothing
    out, notes = grey_of(tiff(ramp(1000), tags={281: (SHORT, (65535,))}))
    assert "rounded up to 10 bits" in notes[-1]
    # tags the pixels contradict (stale, from before a crop or a gain change) are ignored, and said to be
    out, notes = grey_of(tiff(ramp(4095), tags={341: (SHORT, (1023,))}))
    assert out.max() == 255 and any("ignored: its pixels lie outside" in n for n in notes)


def test_tiff_of_12_bits_a_sample_is_scaled_from_4095():
    out, notes = grey_of(tiff(ramp(4095), bits=12))
    assert out.min() == 0 and out.max() == 255 and "its 12 bits a sample" in notes[-1]
    assert "12-bit grey image" in notes[-1]


def test_signed_16_bit_with_negative_values_keeps_them_apart():
    ct = (ramp(4095).astype(np.int32) - 1024).astype(np.int16)  # CT numbers: air -1024 .. bone 3071
    out, notes = grey_of(tiff(ct))
    assert "signed" in notes[-1] and "-4096 to 4095" in notes[-1]
    row = out[0, :, 0]
    assert (np.diff(row) >= 0).all() and len(np.unique(row)) >= 120 and row[0] < row[-1]
    out, notes = grey_of(tiff(ct), Window("full"))
    assert "-32768 to 32767" in notes[-1]


@pytest.mark.parametrize("values, expect", [
    (np.linspace(0, 1, 256, dtype=np.float32), "range 0 to 1"),
    (np.linspace(0, 4095, 256).round().astype(np.float32), "whole numbers: its maximum rounded up to 12 bits"),
    (np.linspace(-3.5, 7.25, 256, dtype=np.float32), "stretched from its minimum to its maximum"),
])
def test_float_images(values, expect):
    out, notes = grey_of(tiff(np.tile(values, (32, 1))))
    assert out.min() == 0 and out.max() == 255 and expect in notes[-1], notes


def test_float_declared_range():
    v = np.tile(np.linspace(-0.5, 0.5, 256, dtype=np.float32), (32, 1))
    out, notes = grey_of(tiff(v, tags={340: (DOUBLE, (-1.0,)), 341: (DOUBLE, (1.0,))}))
    assert abs(out[0, 0, 0] - 64) <= 1 and abs(out[0, -1, 0] - 191) <= 1 and "declares" in notes[-1]


def test_a_flat_16_bit_image_is_blank_and_says_its_source_is_flat():
    o = clean_image(nasty.png(np.full((64, 64), 4660, np.uint16), 0, 16), ImageSettings(size=64))
    assert o.reason == Reason.BLANK_IMAGE
    assert "every pixel of the 16-bit grey source has the same value 4660" in o.detail, o.detail


def test_a_varying_source_flat_only_once_scaled_says_so():
    # 12 bits declared, a picture in values 0-30: within 0-4095 that is under one 8-bit level
    dark = np.zeros((64, 64), np.uint16)
    dark[::2] = 4
    o = clean_image(tiff(dark, bits=12), ImageSettings(size=64))
    assert o.reason == Reason.BLANK_IMAGE
    assert "source varies (values 0 to 4)" in o.detail and "--window" in o.detail, o.detail
    o = clean_image(tiff(dark, bits=12), ImageSettings(size=64, window=parse_window("0,100")))
    assert o.reason is None, o.detail


def test_what_was_done_is_in_the_notes_and_the_output_is_deterministic():
    data = nasty.png(np.dstack([ramp(1023), ramp(1023)[:, ::-1], np.full((32, 256), 512, np.uint16)]), 2, 16)
    a, b = clean_image(data, ImageSettings(size=64, format="png")), clean_image(data, ImageSettings(size=64, format="png"))
    assert a.reason is None and a.data == b.data and a.output_pixels == b.output_pixels
    assert a.notes == ["16-bit RGB image, values 0 to 1023: scaled to 8 bits from 0 to 1023 (its maximum rounded up to 10 bits)"]


def test_8_bit_images_are_untouched():
    data = nasty.png(np.tile(np.arange(256, dtype=np.uint8), (32, 1)), 0, 8)
    d = decode(data, Target(size=4096, min_size=1, window=parse_window("10,90")))
    assert d.depth is None and not d.notes
    assert np.array_equal(np.asarray(d.image)[0, :, 0], np.arange(256))
