"""16-bit colour is read with all its bits: Pillow cuts 16-bit RGB(A) and grey+alpha to their high
bytes (12-bit content: 0-15), `samples` reads the low bytes too, in every layout a camera or a
GIS tool writes (PNG, TIFF chunky or planar, raw or deflated, either byte order, strips or
several), and with premultiplied alpha and 16-bit transparency keys."""

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.media.image import samples
from pipeline.media.image.decode import Target, decode
from tests import nasty
from tests.tiffs import tiff

R12 = np.tile(np.linspace(0, 4095, 256).round().astype(np.uint16), (32, 1))
RGB12 = np.dstack([R12, R12[:, ::-1], np.full_like(R12, 2048)])
OPAQUE = np.full_like(R12, 65535)


def sixteen(data: bytes, fmt: str, color_type: int = -1) -> tuple[np.ndarray, np.ndarray | None]:
    im = Image.open(io.BytesIO(data), formats=[fmt])
    raw = samples.raw_mode(im)
    im.load()
    facts = samples.Facts(fmt, data, raw, 16 if fmt == "PNG" else 0, color_type)
    how = samples._wide_colour(im, facts)
    assert how is not None
    return samples._sixteen_bits(im, facts, how, Image.Image.load)


def rgb_of(data: bytes, background=(255, 255, 255)) -> np.ndarray:
    return np.asarray(decode(data, Target(size=4096, min_size=1, background=background)).image).astype(int)


@pytest.mark.parametrize("alpha", [False, True])
@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("planar", [1, 2])
@pytest.mark.parametrize("deflate", [False, True])
@pytest.mark.parametrize("rows", [None, 7])
def test_tiff_16_bit_colour_is_read_exactly(alpha, order, planar, deflate, rows):
    px = np.dstack([RGB12, OPAQUE - R12]) if alpha else RGB12
    data = tiff(px, planar=planar, deflate=deflate, order=order, rows_per_strip=rows,
                extra_samples=(2,) if alpha else None)
    colour, a = sixteen(data, "TIFF")
    assert np.array_equal(colour, RGB12)
    assert (a is None) if not alpha else np.array_equal(a, OPAQUE - R12)


@pytest.mark.parametrize("planar", [1, 2])
def test_tiff_premultiplied_alpha_is_undone_in_16_bits(planar):
    alpha = np.tile(np.linspace(65535, 16384, 256).round().astype(np.uint16), (32, 1))
    stored = np.rint(RGB12.astype(np.float64) * alpha[..., None] / 65535).astype(np.uint16)
    # (planar deflated: Pillow's own reader of uncompressed planar premultiplied 16-bit fails)
    colour, a = sixteen(tiff(np.dstack([stored, alpha]), planar=planar, deflate=planar == 2, extra_samples=(1,)), "TIFF")
    assert np.array_equal(a, alpha) and np.abs(colour.astype(int) - RGB12).max() <= 4


@pytest.mark.parametrize("color_type, px", [(2, RGB12), (6, np.dstack([RGB12, OPAQUE - R12])),
                                            (4, np.dstack([R12, OPAQUE - R12]))])
def test_png_16_bit_colour_and_grey_alpha_are_read_exactly(color_type, px):
    colour, a = sixteen(nasty.png(px, color_type, 16), "PNG", color_type)
    assert np.array_equal(colour, px[..., :3] if color_type != 4 else px[..., 0])
    assert (a is None) if color_type == 2 else np.array_equal(a, px[..., -1])


@pytest.mark.parametrize("build", ["png", "tiff", "tiff planar deflate"])
def test_12_bit_rgb_in_16_comes_out_in_256_levels_not_16(build):
    data = {"png": lambda: nasty.png(RGB12, 2, 16), "tiff": lambda: tiff(RGB12),
            "tiff planar deflate": lambda: tiff(RGB12, planar=2, deflate=True)}[build]()
    out = rgb_of(data)
    assert len(np.unique(out[..., 0])) == 256 and out[0, 0, 0] == 0 and out[0, -1, 0] == 255
    assert np.array_equal(out[..., 1], out[:, ::-1, 0]) and (out[..., 2] == 128).all()


def test_16_bit_transparency_keys_match_all_16_bits():
    # two colours that share their high bytes: only the keyed one is transparent
    px = np.zeros((32, 64, 3), np.uint16)
    px[:, :32] = (0x1234, 0x5678, 0x9ABC)
    px[:, 32:] = (0x1235, 0x5678, 0x9ABC)
    out = rgb_of(nasty.png(px, 2, 16, trns=bytes.fromhex("123456789abc")), background=(0, 255, 0))
    assert (out[:, :32] == (0, 255, 0)).all() and not (out[:, 32:] == (0, 255, 0)).all(axis=2).any()
    grey = np.tile(np.array([700, 701], np.uint16), (32, 32))
    out = rgb_of(nasty.png(grey, 0, 16, trns=(700).to_bytes(2, "big")), background=(0, 255, 0))
    assert (out[:, 0::2] == (0, 255, 0)).all() and not (out[:, 1::2] == (0, 255, 0)).all(axis=2).any()


def test_tiff_plane_is_a_grey_tiff_of_its_own():
    data = tiff(RGB12, planar=2, deflate=True, rows_per_strip=5, order=">")
    for k in range(3):
        im = Image.open(io.BytesIO(samples.tiff_plane(data, k)))
        assert im.mode.startswith("I;16") and np.array_equal(np.asarray(im), RGB12[..., k])


def test_rgb_with_an_extra_sample_of_no_stated_meaning():
    out = rgb_of(tiff(np.dstack([RGB12, np.full_like(R12, 7)])))
    assert len(np.unique(out[..., 0])) == 256 and (out[..., 2] == 128).all()


def test_a_failing_second_pass_keeps_pillows_8_bits_and_says_so(monkeypatch):
    def broken(*a):
        raise RuntimeError("no")

    monkeypatch.setattr(samples, "_sixteen_bits", broken)
    d = decode(nasty.png(RGB12 << 4, 2, 16), Target(size=4096, min_size=1))
    assert d.depth is None and any("kept at Pillow's 8 bits" in n for n in d.notes)
    assert np.asarray(d.image)[0, -1, 0] == 255
