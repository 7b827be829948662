"""`clean_image`: one verdict per image, the output the user asked for, and exact duplicates
keyed on decoded pixels whatever the container. No exception ever escapes."""

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pipeline.formats.vocabulary import Reason
from pipeline.media.image.clean import ImageSettings, clean_image, pixel_hash
from tests import nasty
from tests.factories import noise_rgb

ARR = noise_rgb(160, 120, seed=11)


def saved(fmt: str, arr=ARR, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, kw", [("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}), ("TIFF", {}),
                                     ("TIFF", {"compression": "tiff_lzw"}), ("PNG", {"optimize": True})])
def test_same_pixels_in_any_lossless_container_have_one_key(fmt, kw):
    ref = clean_image(saved("PNG"), ImageSettings())
    o = clean_image(saved(fmt, **kw), ImageSettings())
    assert o.reason is None and o.content_hash == ref.content_hash


def test_different_pixels_have_different_keys():
    other = ARR.copy()
    other[60, 80, 1] ^= 1  # one bit of one pixel
    assert clean_image(saved("PNG", other), ImageSettings()).content_hash != clean_image(saved("PNG"), ImageSettings()).content_hash


def test_jpeg_key_survives_metadata_changes():
    plain = saved("JPEG", quality=90)
    exif = Image.Exif()
    exif[0x010F] = "SomeCamera"  # Make
    tagged = saved("JPEG", quality=90, exif=exif.tobytes(), comment=b"hello")
    assert plain != tagged
    assert clean_image(plain, ImageSettings()).content_hash == clean_image(tagged, ImageSettings()).content_hash


@pytest.mark.parametrize("fmt, pil", [("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")])
@pytest.mark.parametrize("size", [64, 224])
def test_output_format_size_and_mode(fmt, pil, size):
    o = clean_image(saved("PNG"), ImageSettings(size=size, format=fmt))
    out = Image.open(io.BytesIO(o.data))
    assert (out.format, out.size, out.mode, o.ext) == (pil, (size, size), "RGB", fmt)
    assert (o.width, o.height) == (160, 120)


def test_output_is_deterministic():
    a = clean_image(saved("JPEG"), ImageSettings())
    b = clean_image(saved("JPEG"), ImageSettings())
    assert a.data == b.data and a.content_hash == b.content_hash and a.phash == b.phash


def test_jpeg_key_equals_the_key_of_its_decoded_pixels_in_a_png():
    # a small JPEG is decoded at full size: a PNG of exactly those pixels is the same image
    jpg = saved("JPEG", quality=90)
    png = saved("PNG", np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB")))
    assert clean_image(jpg, ImageSettings()).content_hash == clean_image(png, ImageSettings()).content_hash


def test_pixel_hash_includes_the_shape():
    flat = np.zeros((10, 20, 3), np.uint8)
    assert pixel_hash(Image.fromarray(flat)) != pixel_hash(Image.fromarray(flat.reshape(20, 10, 3)))


SEEDS = [saved("PNG", noise_rgb(48, 40, 1)), saved("JPEG", noise_rgb(48, 40, 2)), saved("GIF", noise_rgb(48, 40, 3)),
         saved("WEBP", noise_rgb(48, 40, 4)), saved("TIFF", noise_rgb(48, 40, 5), compression="tiff_deflate"),
         saved("BMP", noise_rgb(48, 40, 6)), nasty.jpeg_bytes(noise_rgb(48, 40, 7), progressive=True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(SEEDS))), edits=st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 255), st.integers(1, 8)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.floats(0, 1)))
def test_mutated_files_always_end_with_a_verdict(seed, edits, cut):
    data = bytearray(SEEDS[seed])
    for where, value, n in edits:
        p = int(where * (len(data) - 1))
        data[p : p + n] = bytes([value]) * len(data[p : p + n])
    if cut is not None:
        data = data[: max(1, int(cut * len(data)))]
    o = clean_image(bytes(data), ImageSettings(size=32, min_size=8))
    assert o.reason is None or o.reason in set(Reason)
    assert "decoder failed" not in o.detail, o.detail  # an exception we did not map
    if o.reason is None:
        assert Image.open(io.BytesIO(o.data)).size == (32, 32)


def test_measuring_a_damaged_jpeg_fails_as_a_reader_does():
    from pipeline.formats.pixels import measure
    from pipeline.formats.sample import DecodeError

    cut = saved("JPEG", quality=90)[:-200]
    with pytest.raises(DecodeError):
        measure(cut, "jpg")


@pytest.mark.parametrize("mode", ["pad", "stretch", "crop"])
@pytest.mark.parametrize("size, background", [((160, 120), (255, 255, 255)), ((61, 200), (0, 0, 0)),
                                              ((64, 64), (128, 128, 128)), ((300, 37), (10, 200, 90))])
@pytest.mark.parametrize("fmt", ["jpg", "webp", "png"])
def test_the_output_pixels_are_those_of_the_image_encoded(mode, size, background, fmt):
    """The numbers pipe shard adds up are taken from the pixels in hand before the encode (the
    picture's histogram of the blank test, plus the padding's pixels), not by decoding the output
    again (issue 26): the same as counting every pixel of the output image before it is encoded."""
    from pipeline.formats.pixels import channel_sums
    from pipeline.media.image.decode import Target, decode
    from pipeline.media.image.resize import fit

    data = saved("PNG", noise_rgb(*size, seed=size[0]))
    s = ImageSettings(size=48, resize_mode=mode, background=background, format=fmt)
    o = clean_image(data, s)
    encoded = np.asarray(fit(decode(data, Target(size=48, mode=mode, background=background)).image, 48, mode, background))
    sums, squares = channel_sums(encoded)
    assert o.reason is None and (o.output_pixels.width, o.output_pixels.height) == (48, 48)
    assert (o.output_pixels.sums, o.output_pixels.squares) == (sums, squares)
