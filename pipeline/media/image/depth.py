"""Samples of more than 8 bits -> 8 bits, scaled from the range the pixels really use.

A 16-bit PNG or TIFF from a microscope, an X-ray, CT or astronomy camera seldom fills
0-65535: its sensor wrote 10, 12 or 14 bits. Scaled as if it used 0-65535 (what pipe did, and
what most loaders do), 12-bit content comes out in 16 grey levels of 256 and 10-bit content as
one flat colour. So the range is found first, then scaled to 0-255 (`--window`):

* ``auto``: what the file declares about its samples, when it does and its pixels agree:
  PNG sBIT (significant bits; PNG's own specification scales such samples up to the full 16
  bits, so sBIT 12 with values above 4095 says the samples were scaled: 0-65535 it is), the
  TIFF's SMinSampleValue/SMaxSampleValue or MinSampleValue/MaxSampleValue narrower than the
  sample type (ignored, and noted, when pixels lie outside them), a TIFF of fewer than 16 bits a
  sample (12-bit: 0-4095). Otherwise the data's own maximum rounded up to a whole number of bits,
  8 at least: a 16-bit file whose values fit in 8 bits is an 8-bit image in a larger container,
  kept as it is. Negative values (signed 16-bit CT numbers): the smallest signed range of whole
  bits holding them. Floats: 0-1 when they lie in it, whole numbers as integers, anything else
  stretched from its own minimum to its maximum (a float has no bit depth to round to).
* ``full``: the sample type's whole range (0-65535 for 16 bits, 0-1 for floats): one fixed
  scale for every file of a type, whatever its content (what pipe did before).
* ``P1,P2``: the image's own P1-th to P2-th percentile, clipped outside: contrast for each image
  on its own, at the price of intensities no longer comparable between images.

Colour channels share one range (a colour keeps its balance); alpha is always scaled from its
full range. What was done (the source's depth, its values, the range used and why) is one note,
so it lands in the manifest's ``detail``; `blank_detail` says why a flat result is flat in terms
that are true of the source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.media.image.window import Window


@dataclass
class Declared:
    """What a file says about its samples; None where it says nothing."""

    kind: str = "uint"  # uint | int (signed) | float
    bits: int | None = None  # bits a sample as stored: PNG bit depth, TIFF BitsPerSample
    significant: int | None = None  # PNG sBIT of the colour channels
    low: float | None = None  # TIFF SMinSampleValue (or MinSampleValue)
    high: float | None = None  # TIFF SMaxSampleValue (or MaxSampleValue)
    tags: str = ""  # the TIFF tags low and high come from, for the note


@dataclass
class Scaled:
    """What was done to one image's samples."""

    source: str  # "16-bit grey", "12-bit RGB", "32-bit float grey"
    vmin: float  # the source's colour samples, smallest and largest
    vmax: float
    flat: bool  # every channel of the source holds one value
    lo: float  # the range scaled to 0-255
    hi: float
    why: str

    def note(self) -> str:
        return (f"{self.source} image, values {_num(self.vmin)} to {_num(self.vmax)}: scaled to 8 bits from "
                f"{_num(self.lo)} to {_num(self.hi)} ({self.why})")


def to_8bit(values: np.ndarray, declared: Declared, window: Window, source: str,
            notes: list[str]) -> tuple[np.ndarray, Scaled]:
    """``values`` (H, W) or (H, W, C) of any numeric type -> the same shape in uint8, and what was
    done (also appended to ``notes``)."""
    a = values
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        notes.append("NaN or infinite pixel values set to 0")
        a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    vmin, vmax, flat = _extremes(a)
    lo, hi, why = _range(a, vmin, vmax, declared, window, notes)
    s = Scaled(source, vmin, vmax, flat, lo, hi, why)
    notes.append(s.note())
    return _scale(a, lo, hi), s


def alpha_8bit(alpha: np.ndarray) -> np.ndarray:
    """A 16-bit alpha channel in 8 bits: always from its full range (opaque is 65535)."""
    return _scale(alpha, 0.0, 65535.0)


def blank_detail(s: Scaled, colour: str, min_level: float) -> str:
    """Why the cleaned image of a high-depth source is one flat colour, true of the source."""
    if s.flat:
        value = f"value {_num(s.vmin)}" if s.vmin == s.vmax else "colour"
        return f"every pixel of the {s.source} source has the same {value}: one flat colour ({colour}), nothing to learn from it"
    return (f"the {s.source} source varies (values {_num(s.vmin)} to {_num(s.vmax)}), but scaled to 8 bits from "
            f"{_num(s.lo)} to {_num(s.hi)} ({s.why}) it is one flat colour ({colour}, no channel varies by "
            f"{min_level:g} level or more): --window P1,P2 stretches each image between its own percentiles")


# -- the range --------------------------------------------------------------------------------

def _range(a: np.ndarray, vmin: float, vmax: float, d: Declared, w: Window, notes: list[str]) -> tuple[float, float, str]:
    if w.mode == "full":
        lo, hi = _full(a, vmin, vmax, d)
        return lo, hi, "--window full: the whole range of its sample type"
    if w.mode == "percentile":
        return _percentiles(a, vmin, vmax, w)
    if a.dtype.kind == "f" or d.kind == "float":
        return _auto_float(a, vmin, vmax, d, notes)
    return _declared(vmin, vmax, d, notes) or _whole_bits(vmin, vmax)


def _full(a: np.ndarray, vmin: float, vmax: float, d: Declared) -> tuple[float, float]:
    if a.dtype.kind == "f" or d.kind == "float":
        return 0.0, 1.0
    return _type_range(vmin, vmax, d)


def _type_range(vmin: float, vmax: float, d: Declared) -> tuple[float, float]:
    """An integer sample type's whole range (Pillow's 32-bit "I" of unknown origin: 16 bits when
    its values fit, as a PGM or a signed 16-bit TIFF's do)."""
    bits = d.bits or (16 if -(2**15) <= vmin and vmax < 2**16 else 32)
    if d.kind == "int" or vmin < 0:
        return -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1
    return 0.0, 2.0**bits - 1


def _percentiles(a: np.ndarray, vmin: float, vmax: float, w: Window) -> tuple[float, float, str]:
    lo, hi = (float(v) for v in np.percentile(a, [w.low, w.high]))
    if hi > lo:
        return lo, hi, f"--window {w}: its {w.low:g}th to {w.high:g}th percentile"
    # most pixels hold one value (a mask, a sparse star field): the percentiles meet
    return vmin, vmax, f"--window {w}: its percentiles meet, so from its minimum to its maximum"


def _declared(vmin: float, vmax: float, d: Declared, notes: list[str]) -> tuple[float, float, str] | None:
    bits = d.bits or 16
    if d.significant and d.significant < bits:
        s = d.significant
        if vmax < 2**s:
            return 0.0, 2.0**s - 1, f"{s} significant bits, as its PNG sBIT says"
        return 0.0, 2.0**bits - 1, (f"its PNG sBIT says {s} significant bits, and its values above {2**s - 1} say they "
                                    f"were scaled up to {bits} bits, as the PNG specification has them written")
    if d.low is not None or d.high is not None:
        whole = _type_range(vmin, vmax, d)
        lo = d.low if d.low is not None else whole[0]
        hi = d.high if d.high is not None else whole[1]
        if not (lo <= vmin and vmax <= hi and lo < hi):
            notes.append(f"the TIFF's {d.tags} ({_num(lo)} to {_num(hi)}) ignored: its pixels lie outside")
        elif (lo, hi) != whole:  # the type's own range (MaxSampleValue 65535 at 16 bits) says nothing
            return lo, hi, f"the range its TIFF {d.tags} declares"
    if d.bits and d.bits < 16 and d.kind == "uint":
        return 0.0, 2.0**d.bits - 1, f"its {d.bits} bits a sample"
    return None


def _whole_bits(vmin: float, vmax: float) -> tuple[float, float, str]:
    """The data's own range rounded out to whole bits, 8 at least."""
    if vmin >= 0:
        n = max(8, int(vmax).bit_length())
        return 0.0, 2.0**n - 1, f"its maximum rounded up to {n} bits"
    n = 8
    while not (-(2 ** (n - 1)) <= vmin and vmax <= 2 ** (n - 1) - 1):
        n += 1
    return -(2.0 ** (n - 1)), 2.0 ** (n - 1) - 1, f"its values rounded out to a signed {n}-bit range"


def _auto_float(a: np.ndarray, vmin: float, vmax: float, d: Declared, notes: list[str]) -> tuple[float, float, str]:
    if d.low is not None and d.high is not None:
        if d.low <= vmin and vmax <= d.high and d.low < d.high:
            return d.low, d.high, f"the range its TIFF {d.tags} declares"
        notes.append(f"the TIFF's {d.tags} ({_num(d.low)} to {_num(d.high)}) ignored: its pixels lie outside")
    if 0.0 <= vmin and vmax <= 1.0:
        return 0.0, 1.0, "a float image's range 0 to 1"
    if bool((a == np.floor(a)).all()) and vmax < 2**32 and vmin > -(2**31):
        lo, hi, why = _whole_bits(vmin, vmax)
        return lo, hi, f"whole numbers: {why}"
    return vmin, vmax, "a float image without a declared range: stretched from its minimum to its maximum"


# -- the numbers ------------------------------------------------------------------------------

def _extremes(a: np.ndarray) -> tuple[float, float, bool]:
    """Smallest and largest sample, and whether every channel holds one value."""
    per = a.reshape(-1, a.shape[2]) if a.ndim == 3 else a.reshape(-1, 1)
    low, high = per.min(axis=0), per.max(axis=0)
    return float(low.min()), float(high.max()), bool((low == high).all())


def _scale(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``lo``..``hi`` -> 0..255, rounded, clipped outside. 16-bit samples through a table of
    65,536 entries (no float copy of a large image); anything else in float64."""
    factor = 255.0 / (hi - lo) if hi > lo else 0.0
    if a.dtype.kind == "u" and a.dtype.itemsize <= 2:
        table = np.rint((np.arange(2 ** (8 * a.dtype.itemsize), dtype=np.float64) - lo) * factor).clip(0, 255)
        return table.astype(np.uint8)[a]
    return np.rint((a.astype(np.float64) - lo) * factor).clip(0, 255).astype(np.uint8)


def _num(v: float) -> str:
    return f"{v:g}" if v != int(v) or abs(v) >= 1e15 else str(int(v))
