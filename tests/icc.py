"""Small ICC v2 profiles built from first principles, for fixtures (no profile files needed).

* `display_p3()`: a matrix/TRC RGB profile with Display P3 primaries and the sRGB curve.
* `press_cmyk()`: a CMYK output profile whose A2B0 table maps each ink to a realistic press
  colour (cyan is (0, 158, 224) in sRGB, not (0, 255, 255)), so converting through it gives
  visibly different colours from Pillow's plain CMYK formula.

The reference maths (`p3_to_srgb`, `press_cmyk_to_srgb`) lets tests check conversions without
asking LittleCMS what LittleCMS does.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np

D50 = (0.9642, 1.0, 0.8249)
# D50-adapted RGB -> XYZ matrices (ICC PCS is D50)
P3_D50 = np.array([[0.515102, 0.291965, 0.157153], [0.241182, 0.692236, 0.066582], [-0.001050, 0.041882, 0.784378]])
SRGB_D50 = np.array([[0.4360747, 0.3850649, 0.1430804], [0.2225045, 0.7168786, 0.0606169], [0.0139322, 0.0971045, 0.7141733]])
# the colour each ink prints on white paper, in sRGB; overprints multiply
INKS = {"C": (0, 158, 224), "M": (229, 0, 126), "Y": (255, 237, 0), "K": (35, 31, 32)}


def _s15(v: float) -> bytes:
    return struct.pack(">i", round(v * 65536))


def _xyz(x: float, y: float, z: float) -> bytes:
    return b"XYZ \0\0\0\0" + _s15(x) + _s15(y) + _s15(z)


def _desc(text: str) -> bytes:
    a = text.encode("ascii") + b"\0"
    return b"desc\0\0\0\0" + struct.pack(">I", len(a)) + a + b"\0" * 4 + b"\0" * 4 + b"\0\0" + b"\0" + b"\0" * 67


def _text(text: str) -> bytes:
    return b"text\0\0\0\0" + text.encode("ascii") + b"\0"


def _curve_srgb(n: int = 1024) -> bytes:
    x = np.linspace(0, 1, n)
    y = np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)
    return b"curv\0\0\0\0" + struct.pack(">I", n) + np.round(y * 65535).astype(">u2").tobytes()


def _profile(cls: bytes, space: bytes, pcs: bytes, tags: list[tuple[bytes, bytes]]) -> bytes:
    table = struct.pack(">I", len(tags))
    offset = 128 + 4 + 12 * len(tags)
    body = b""
    for sig, data in tags:
        data += b"\0" * (-len(data) % 4)
        table += sig + struct.pack(">II", offset + len(body), len(data))
        body += data
    size = offset + len(body)
    header = (struct.pack(">I", size) + b"lcms" + bytes((2, 0x10, 0, 0)) + cls + space + pcs + b"\0" * 12 + b"acsp"
              + b"\0" * 24 + b"\0\0\0\0" + _s15(D50[0]) + _s15(D50[1]) + _s15(D50[2]) + b"\0" * 48)
    assert len(header) == 128
    return header + table + body


def display_p3() -> bytes:
    tags = [(b"desc", _desc("Display P3 (test)")), (b"cprt", _text("public domain")), (b"wtpt", _xyz(*D50))]
    for i, c in enumerate(b"rgb"):
        tags.append((bytes((c,)) + b"XYZ", _xyz(*P3_D50[:, i])))
    curve = _curve_srgb()
    tags += [(b"rTRC", curve), (b"gTRC", curve), (b"bTRC", curve)]
    return _profile(b"mntr", b"RGB ", b"XYZ ", tags)


def press_cmyk() -> bytes:
    grid = 2
    clut = b""
    for corner in itertools.product(range(grid), repeat=4):  # C slowest, K fastest
        L, a, b = _srgb_to_lab(_overprint(np.array(corner, dtype=float)))
        clut += struct.pack(">HHH", round(L * 652.8), round((a + 128) * 256), round((b + 128) * 256))
    identity = struct.pack(">HH", 0, 65535)
    lut = (b"mft2\0\0\0\0" + bytes((4, 3, grid, 0)) + b"".join(_s15(v) for v in (1, 0, 0, 0, 1, 0, 0, 0, 1))
           + struct.pack(">HH", 2, 2) + identity * 4 + clut + identity * 3)
    tags = [(b"desc", _desc("Press CMYK (test)")), (b"cprt", _text("public domain")), (b"wtpt", _xyz(*D50)),
            (b"A2B0", lut)]
    return _profile(b"prtr", b"CMYK", b"Lab ", tags)


# -- reference maths ------------------------------------------------------------------------

def _decode_srgb(v):
    v = np.asarray(v, dtype=float) / 255
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def _encode_srgb(lin):
    lin = np.clip(lin, 0, 1)
    return 255 * np.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin ** (1 / 2.4) - 0.055)


def p3_to_srgb(rgb) -> np.ndarray:
    """Display P3 8-bit -> sRGB 8-bit (float), through D50 XYZ."""
    xyz = P3_D50 @ _decode_srgb(rgb)
    return _encode_srgb(np.linalg.solve(SRGB_D50, xyz))


def _overprint(inks: np.ndarray) -> np.ndarray:
    """sRGB (0-255) of ink amounts (0-1 each, C M Y K) on white paper: transmittances multiply."""
    lin = np.ones(3)
    for amount, name in zip(inks, "CMYK"):
        lin = lin * (1 - amount + amount * _decode_srgb(INKS[name]))
    return _encode_srgb(lin)


def press_cmyk_to_srgb(cmyk) -> np.ndarray:
    """What the press profile maps a corner CMYK value (each 0 or 255) to, in sRGB."""
    return _overprint(np.asarray(cmyk, dtype=float) / 255)


def _srgb_to_lab(rgb) -> tuple[float, float, float]:
    x, y, z = (SRGB_D50 @ _decode_srgb(rgb)) / np.array(D50)
    f = lambda t: np.cbrt(t) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29  # noqa: E731
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))
