"""Broken files the way decoder test suites break them (PngSuite's x*.png, truncated GIF, WebP,
TIFF, BMP, AVIF, JPEG 2000), and files named like images that are not: each gets its reason."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from pipeline.media.image.clean import ImageSettings, clean_image
from tests import nasty
from tests.factories import noise_rgb
from tests.tiffs import tiff

RGB = noise_rgb(96, 64, seed=5)
GOOD_PNG = nasty.png(RGB, 2)


def verdict(data: bytes, **settings):
    o = clean_image(data, ImageSettings(**settings))
    return o.reason, o


def saved(fmt: str, im=None, **kw) -> bytes:
    buf = io.BytesIO()
    (im or Image.fromarray(RGB)).save(buf, fmt, **kw)
    return buf.getvalue()


def with_ihdr(color_type: int, depth: int) -> bytes:
    ihdr = nasty.png_chunk(b"IHDR", struct.pack(">IIBBBBB", 96, 64, depth, color_type, 0, 0, 0))
    return GOOD_PNG[:8] + ihdr + GOOD_PNG[33:]


# PngSuite's corrupted files, rebuilt: name -> (bytes, reason, words in the detail)
PNGSUITE = {
    "xs1n0g01 signature byte 1": (b"\x09" + GOOD_PNG[1:], "corrupt", "signature"),
    "xs2n0g01 signature byte 2": (GOOD_PNG[:1] + b"Q" + GOOD_PNG[2:], "corrupt", "signature"),
    "xs4n0g01 signature byte 4": (GOOD_PNG[:3] + b"g" + GOOD_PNG[4:], "corrupt", "signature"),
    "xs7n0g01 signature byte 7": (GOOD_PNG[:6] + b" " + GOOD_PNG[7:], "corrupt", "signature"),
    "xcrn0g04 added CR": (GOOD_PNG.replace(b"\r\n", b"\r\r\n", 1), "corrupt", "text-mode"),
    "xlfn0g04 added LF": (GOOD_PNG[:5] + b"\n" + GOOD_PNG[5:], "corrupt", "text-mode"),
    "xhdn0g08 bad IHDR CRC": (nasty.png_replace_crc(GOOD_PNG, b"IHDR"), "corrupt", "CRC in the PNG chunk IHDR"),
    "xcsn0g01 bad IDAT CRC": (nasty.png_replace_crc(GOOD_PNG, b"IDAT"), "corrupt", "CRC in the PNG chunk IDAT"),
    "xc1n0g08 colour type 1": (with_ihdr(1, 8), "corrupt", "colour type 1"),
    "xc9n2c08 colour type 9": (with_ihdr(9, 8), "corrupt", "colour type 9"),
    "xd0n2c08 bit depth 0": (with_ihdr(2, 0), "corrupt", "bit depth 0"),
    "xd3n2c08 bit depth 3": (with_ihdr(2, 3), "corrupt", "bit depth 3"),
    "xd9n2c08 bit depth 99": (with_ihdr(2, 99), "corrupt", "bit depth 99"),
    "xdtn0g01 no IDAT": (nasty.png_without(GOOD_PNG, b"IDAT"), "corrupt", "no IDAT"),
    "no IEND": (nasty.png_without(GOOD_PNG, b"IEND"), "truncated", "IEND"),
    "cut inside IDAT": (GOOD_PNG[: len(GOOD_PNG) // 2], "truncated", "IDAT"),
}


@pytest.mark.parametrize("name", PNGSUITE)
def test_pngsuite_style_broken_files(name):
    data, reason, words = PNGSUITE[name]
    got, o = verdict(data)
    assert got == reason, o.detail
    assert words in o.detail, o.detail


def test_bad_zlib_stream_with_a_valid_crc_is_corrupt():
    (_, pos, length), = [c for c in nasty.png_chunks(GOOD_PNG) if c[0] == b"IDAT"]
    body = bytearray(GOOD_PNG[pos + 8 : pos + 8 + length])
    body[length // 2 : length // 2 + 40] = bytes(40)
    bad = GOOD_PNG[:pos] + nasty.png_chunk(b"IDAT", bytes(body)) + GOOD_PNG[pos + 12 + length :]
    reason, o = verdict(bad)
    assert reason == "corrupt" and "PNG" in o.detail


def test_ancillary_chunk_with_bad_crc_and_trailing_bytes_are_noted_not_rejected():
    text = nasty.png_chunk(b"tEXt", b"Comment\x00hello", crc=1)
    data = nasty.png(RGB, 2, extra=[text]) + b"trailing garbage"
    reason, o = verdict(data, size=96, resize_mode="stretch")
    assert reason is None, o.detail
    assert any("ancillary PNG chunk tEXt" in n for n in o.notes)
    assert any("after the PNG's IEND" in n for n in o.notes)


@pytest.mark.parametrize("chunk", [b"zTXt", b"iCCP"])
@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("crc", ["valid", "bad"])
def test_an_ancillary_chunk_compressed_by_an_unknown_method_is_ignored_not_corrupt(chunk, where, crc):
    # Pillow refuses the whole file for it (SyntaxError); libpng ignores the chunk: it holds a
    # colour profile or text, never pixels. Its pixels are the image's: the same key as without it
    body = (b"ICC Profile" if chunk == b"iCCP" else b"Comment") + b"\x00\x01" + zlib.compress(b"whatever")
    bad = nasty.png_chunk(chunk, body, crc=1 if crc == "bad" else None)
    data = nasty.png(RGB, 2, **{"extra" if where == "before" else "after": [bad]})
    reason, o = verdict(data)
    assert reason is None, o.detail
    assert o.content_hash == verdict(GOOD_PNG)[1].content_hash
    assert any(f"ancillary PNG chunk {chunk.decode()}" in n and "ignored" in n for n in o.notes), o.notes


@pytest.mark.parametrize("chunk", [b"zTXt", b"iCCP"])
def test_png_metadata_bomb_is_a_decompression_bomb(chunk):
    bomb = nasty.png_chunk(chunk, b"x\x00\x00" + zlib.compress(b"a" * (64 << 20)))
    reason, o = verdict(nasty.png(RGB, 2, extra=[bomb]))
    assert reason == "decompression_bomb", o.detail


def test_pixel_bomb_is_refused_from_the_header_before_decoding():
    ihdr = nasty.png_chunk(b"IHDR", struct.pack(">IIBBBBB", 50_000, 50_000, 8, 2, 0, 0, 0))
    bomb = GOOD_PNG[:8] + ihdr + GOOD_PNG[33:]  # 2.5 gigapixels declared, a few KB of data
    reason, o = verdict(bomb)
    assert reason == "decompression_bomb" and (o.width, o.height) == (50_000, 50_000)
    reason, o = verdict(GOOD_PNG, max_pixels=96 * 64 - 1)
    assert reason == "decompression_bomb" and "--max-pixels" in o.detail
    assert verdict(GOOD_PNG, max_pixels=96 * 64)[0] is None


def test_too_small_is_judged_on_the_short_side():
    reason, o = verdict(GOOD_PNG, min_size=65)
    assert reason == "too_small" and (o.width, o.height) == (96, 64)
    assert verdict(GOOD_PNG, min_size=64)[0] is None


def test_gif_cut_short_or_without_trailer_is_truncated():
    gif = saved("GIF", Image.fromarray(RGB).convert("P"))
    assert verdict(gif)[0] is None
    for cut in (gif[: len(gif) // 2], gif[:-1]):
        reason, o = verdict(cut)
        assert reason == "truncated", o.detail


def test_animated_files_give_their_first_frame():
    frames = [Image.new("RGB", (64, 64), c) for c in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    for f in frames:  # a white corner: one flat colour would be a blank_image
        f.paste((255, 255, 255), (0, 0, 16, 16))
    for fmt, kw in (("GIF", {}), ("PNG", {}), ("WEBP", {"lossless": True})):
        buf = io.BytesIO()
        frames[0].save(buf, fmt, save_all=True, append_images=frames[1:], **kw)
        o = clean_image(buf.getvalue(), ImageSettings(size=64, format="png"))
        assert o.reason is None, (fmt, o.detail)
        out = np.asarray(Image.open(io.BytesIO(o.data)))
        assert np.abs(out[20:, 20:].astype(int) - (255, 0, 0)).max() <= 2, fmt
        assert any("animated (3 frames)" in n for n in o.notes), (fmt, o.notes)


def test_webp_truncated_and_damaged():
    lossy = saved("WEBP", quality=80)
    reason, o = verdict(lossy[: len(lossy) // 2])
    assert reason == "truncated", o.detail
    bad = bytearray(lossy)
    bad[len(bad) // 2 : len(bad) // 2 + 60] = bytes(60)
    reason, o = verdict(bytes(bad))
    assert reason == "corrupt", o.detail


@pytest.mark.parametrize("compression", [None, "tiff_deflate", "tiff_lzw", "packbits"])
def test_tiff_truncated(compression):
    data = saved("TIFF", **({"compression": compression} if compression else {}))
    assert verdict(data)[0] is None
    reason, o = verdict(data[: len(data) * 2 // 3])
    assert reason == "truncated", o.detail


def test_bigtiff_decodes():
    data = saved("TIFF", big_tiff=True)
    assert data[:4] == b"II+\x00" and verdict(data)[0] is None


def test_tiff_damaged_deflate_data_is_corrupt():
    data = bytearray(saved("TIFF", compression="tiff_deflate"))
    data[200:260] = bytes(60)
    reason, o = verdict(bytes(data))
    assert reason == "corrupt", o.detail


GREY = np.tile(np.arange(256, dtype=np.uint8), (64, 1))


def test_tiff_extra_sample_plane_left_out_is_not_damage():
    # a planar grey TIFF with an extra sample of no stated meaning, whose plane the writer left
    # out (offset 0, 0 bytes: GDAL's sparse files): no reader shows that plane, the grey is whole.
    # (Deflated: Pillow's own reader of uncompressed planar grey with an extra sample fails.)
    data = tiff(np.dstack([GREY, GREY[:, ::-1]]), planar=2, deflate=True, rows_per_strip=16,
                strips=lambda o, c: (o[:4] + [0] * 4, c[:4] + [0] * 4))
    reason, o = verdict(data, size=64, min_size=1)
    assert reason is None, o.detail
    assert o.content_hash == verdict(tiff(GREY), size=64, min_size=1)[1].content_hash


@pytest.mark.parametrize("deflate", [False, True])
@pytest.mark.parametrize("planar", [1, 2])
def test_tiff_strip_the_pixels_need_left_out_is_corrupt(deflate, planar):
    # the same absence in a plane the image shows: Pillow would read raw pixels from offset 0
    # (the header) in silence, libtiff fails
    data = tiff(np.dstack([GREY, GREY[:, ::-1], GREY]), planar=planar, deflate=deflate, rows_per_strip=16,
                strips=lambda o, c: (o[:1] + [0] + o[2:], c[:1] + [0] + c[2:]))
    reason, o = verdict(data, size=64, min_size=1)
    assert reason == "corrupt" and "strip/tile 1 has no bytes" in o.detail, o.detail


@pytest.mark.parametrize("spp", [1, 3, 4])
def test_tiff_uncompressed_strip_with_a_byte_count_past_the_end_is_whole_when_its_rows_are(spp):
    # some writers put a wrong StripByteCounts (the image's, or garbage) on an uncompressed strip;
    # readers take only the rows the image has, and so do we: noted, not truncated
    px = np.dstack([noise_rgb(52, 53, seed=2)] + ([GREY[:53, :52]] if spp == 4 else []))[..., :spp]
    good = tiff(px, extra_samples=(2,) if spp == 4 else None)
    lying = tiff(px, extra_samples=(2,) if spp == 4 else None, strips=lambda o, c: (o, [35711440]))
    reason, o = verdict(lying, size=64, min_size=1)
    assert reason is None, o.detail
    assert o.content_hash == verdict(good, size=64, min_size=1)[1].content_hash
    assert any("more than the file holds" in n and "are all there" in n for n in o.notes), o.notes
    # the same count on a file that really lost rows stays truncated
    reason, o = verdict(lying[: 8 + 52 * 40 * spp] + lying[-200:], size=64, min_size=1)
    assert reason == "truncated", o.detail


def test_bmp_truncated():
    data = saved("BMP")
    reason, o = verdict(data[: len(data) // 2])
    assert reason == "truncated", o.detail


def test_avif_and_jpeg2000_decode_and_truncate():
    for fmt in ("AVIF", "JPEG2000"):
        data = saved(fmt)
        assert verdict(data)[0] is None, fmt
        reason, o = verdict(data[: len(data) // 2])
        assert reason == "truncated", (fmt, o.detail)


@pytest.mark.parametrize("data, words", [
    (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64), "HEIC"),
    (b"\xff\x0a" + bytes(64), "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n" + bytes(64), "JPEG XL"),
    (b"<!DOCTYPE html><html><head><title>404 Not Found</title></head><body></body></html>", "HTML"),
    (b"a cat sitting on a mat, photographed in the evening\n" * 3, "text"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "SVG"),
])
def test_formats_without_a_decoder_and_non_images_are_unsupported(data, words):
    reason, o = verdict(data)
    assert reason == "unsupported_format" and words in o.detail, o.detail


def test_apple_cgbi_png_is_unsupported_not_corrupt():
    cgbi = nasty.png_chunk(b"CgBI", b"\x50\x00\x20\x06")
    reason, o = verdict(GOOD_PNG[:8] + cgbi + GOOD_PNG[8:])
    assert reason == "unsupported_format" and "CgBI" in o.detail


def test_a_format_this_pillow_cannot_decode_is_unsupported(monkeypatch):
    data = saved("AVIF")
    monkeypatch.delitem(Image.OPEN, "AVIF")  # a Pillow built without libavif
    reason, o = verdict(data)
    assert reason == "unsupported_format" and "AVIF" in o.detail


def test_a_png_named_jpg_is_judged_by_its_content():
    # clean_image never sees the name: the bytes decide
    assert verdict(GOOD_PNG)[0] is None
