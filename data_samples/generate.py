"""Generate data_samples/raw/: a small dataset with the problems real datasets have.

    python data_samples/generate.py            # writes data_samples/raw/ (replacing it)
    python data_samples/generate.py --out DIR  # somewhere else

Seeded and deterministic: running it again gives byte-identical files (with the same Pillow
and zlib). Three classes a small CNN learns in a minute on a CPU (circles, stripes,
triangles: shape decides, colours are random, shapes are dark on a light background),
captions beside two thirds of the images, and the nasty files listed in data_samples/README.md.
`EXPECTED` says what `pipe clean` should make of each nasty file; tests/test_data_samples.py
holds it to that.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests import nasty  # noqa: E402 - builders of broken files, shared with the tests
from tests.icc import press_cmyk  # noqa: E402

W, H = 256, 192
PER_CLASS = 60  # the most tests/test_data_samples.py allows: every image helps a short training
SEED = 20240601
CLASSES = ("circles", "stripes", "triangles")
COLOUR_NAMES = {"red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200), "yellow": (230, 200, 40),
                "purple": (130, 50, 160), "orange": (240, 130, 30), "grey": (128, 128, 128), "white": (240, 240, 240),
                "black": (20, 20, 20), "teal": (30, 150, 150)}

# what pipe clean should decide for each nasty file: (status, reason); "duplicate" means the
# file or its twin ends as a duplicate (which one is kept is the dedup policy's business)
EXPECTED: dict[str, tuple[str, str | None]] = {}
UPRIGHT: dict[str, Image.Image] = {}  # what an EXIF-rotated file shows once its orientation is applied


def colour(rng) -> tuple[str, tuple[int, int, int]]:
    name = list(COLOUR_NAMES)[rng.integers(len(COLOUR_NAMES))]
    jitter = rng.integers(-25, 26, 3)
    return name, tuple(int(v) for v in np.clip(np.array(COLOUR_NAMES[name]) + jitter, 0, 255))


def ink(rng) -> tuple[str, tuple[int, int, int]]:
    """A random colour, darkened: shapes are always darker than their background (ink on paper).

    With random contrast (a light shape on one image, a dark one on the next) a small CNN needs
    far more than 60 images a class to tell circles from triangles regardless of contrast:
    measured, the built-in image model (width 16, 64 px, 15-20 epochs) reached 60-80%
    validation accuracy with random contrast and 86-97% with dark shapes on light backgrounds.
    """
    name, c = colour(rng)
    return f"dark {name}", tuple(int(0.45 * v) for v in c)


def background(rng) -> tuple[str, Image.Image]:
    """A light gradient (see `ink`) with a little noise."""
    name, c1 = colour(rng)
    name, c1 = f"light {name}", tuple(int(170 + v / 3) for v in c1)
    c2 = tuple(int(v) for v in np.clip(np.array(c1) + rng.integers(-60, 61, 3), 0, 255))
    t = np.linspace(0, 1, W)[None, :, None] if rng.random() < 0.5 else np.linspace(0, 1, H)[:, None, None]
    grad = np.array(c1) * (1 - t) + np.array(c2) * t
    arr = np.broadcast_to(grad, (H, W, 3)) + rng.normal(0, 6, (H, W, 3))
    return name, Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def where(x: float, y: float) -> str:
    return f"{('top', 'middle', 'bottom')[min(2, int(3 * y / H))]} {('left', 'centre', 'right')[min(2, int(3 * x / W))]}"


def draw_circles(rng) -> tuple[Image.Image, str]:
    bg_name, im = background(rng)
    d = ImageDraw.Draw(im)
    n = int(rng.integers(1, 4))
    name, c = ink(rng)
    for _ in range(n):
        r = int(rng.integers(24, 60))  # at least 6 px at the demo's 64 px: a disc, not a dot
        x, y = int(rng.integers(r, W - r)), int(rng.integers(r, H - r))
        d.ellipse([x - r, y - r, x + r, y + r], fill=c)
    size = "large" if r > 40 else "small"
    return im, f"{n} {name} circle{'s' if n > 1 else ''} on a {bg_name} background, a {size} one at the {where(x, y)}"


def draw_stripes(rng) -> tuple[Image.Image, str]:
    (n1, c1), (n2, c2) = colour(rng), colour(rng)
    angle, period = rng.uniform(0, np.pi), rng.uniform(10, 30)
    y, x = np.mgrid[0:H, 0:W]
    band = (np.cos(angle) * x + np.sin(angle) * y) % period < period / 2
    arr = np.where(band[..., None], np.array(c1), np.array(c2)) + rng.normal(0, 6, (H, W, 3))
    tilt = ("horizontal", "diagonal", "vertical", "diagonal")[int(angle / (np.pi / 4) + 0.5) % 4]
    width = "thin" if period < 17 else "wide"
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8)), f"{width} {tilt} {n1} and {n2} stripes"


def draw_triangles(rng) -> tuple[Image.Image, str]:
    bg_name, im = background(rng)
    d = ImageDraw.Draw(im)
    n = int(rng.integers(1, 3))
    name, c = ink(rng)
    for _ in range(n):
        cx, cy, r = int(rng.integers(50, W - 50)), int(rng.integers(50, H - 50)), int(rng.integers(34, 58))
        a0 = rng.uniform(0, 2 * np.pi)
        d.polygon([(cx + r * np.cos(a0 + k * 2 * np.pi / 3), cy + r * np.sin(a0 + k * 2 * np.pi / 3)) for k in range(3)], fill=c)
    return im, f"{n} {name} triangle{'s' if n > 1 else ''} on a {bg_name} background, one at the {where(cx, cy)}"


DRAW = {"circles": draw_circles, "stripes": draw_stripes, "triangles": draw_triangles}


def jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=kw.pop("quality", 85), **kw)
    return buf.getvalue()


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def put(root: Path, rel: str, data: bytes, expect: tuple[str, str | None] | None = None) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    if expect:
        EXPECTED[rel] = expect


def generate(root: Path) -> None:
    rng = np.random.default_rng(SEED)
    images: dict[str, Image.Image] = {}
    captions: set[str] = set()
    for cls in CLASSES:
        singular = cls[:-1]
        for i in range(PER_CLASS):
            im, caption = DRAW[cls](rng)
            im = im.filter(ImageFilter.GaussianBlur(0.6))
            rel = f"{cls}/{singular}_{i:03d}.jpg"
            images[rel] = im
            put(root, rel, jpeg(im))
            if i % 3 != 2:  # captions beside two thirds of the images (pairs enough for the demo's contrastive
                # step, images alone enough for its --pairs-only to matter); some with a BOM and Windows line ends
                while caption in captions:  # generated captions can repeat; real ones rarely do
                    caption += ", again"
                captions.add(caption)
                text = f"a photo of {caption}\n" if i % 2 else f"\ufeffA photo of {caption}.\r\n"
                put(root, rel[:-4] + ".txt", text.encode("utf-8"))
    nasty_files(root, rng, images)


def nasty_files(root: Path, rng, images: dict[str, Image.Image]) -> None:
    c = images
    # captions in the encodings scraped data comes in
    put(root, "circles/circle_001.txt", "一张照片：蓝色背景上的一个红色圆形。\n".encode("gbk"), ("kept", None))
    put(root, "triangles/triangle_001.txt", "青い背景に黄色い三角形の写真です。\n".encode("shift_jis"), ("kept", None))
    put(root, "stripes/stripe_001.txt", "A photo of red and white stripes (UTF-16 with BOM)\r\n".encode("utf-16"), ("kept", None))
    # broken images
    put(root, "circles/circle_broken_truncated.jpg", nasty.truncate(jpeg(c["circles/circle_002.jpg"]), 0.6), ("quarantined", "truncated"))
    put(root, "stripes/stripe_broken_entropy.jpg", nasty.cut_scan(jpeg(c["stripes/stripe_002.jpg"]), 0.5), ("quarantined", "corrupt"))
    put(root, "triangles/triangle_zeroed_blocks.jpg",
        nasty.zero_run(jpeg(c["triangles/triangle_002.jpg"], restart_marker_blocks=8), 0.4, 512), ("quarantined", "corrupt"))
    put(root, "triangles/triangle_empty.jpg", b"", ("quarantined", "zero_bytes"))
    put(root, "circles/download_error.jpg", b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>"
        b"<body><h1>Forbidden</h1></body></html>\n", ("quarantined", "unsupported_format"))
    put(root, "stripes/not_an_image.png", b"this file was saved with the wrong extension\n", ("quarantined", "unsupported_format"))
    put(root, "circles/thumbnail_16px.png", encode(c["circles/circle_003.jpg"].resize((16, 12)), "PNG"), ("quarantined", "too_small"))
    # odd but fine images: each a picture of its own, so that dedup has no reason to touch it
    def fresh(cls: str) -> Image.Image:
        return DRAW[cls](rng)[0].filter(ImageFilter.GaussianBlur(0.6))

    rgba = fresh("circles").convert("RGBA")
    alpha = np.full((H, W), 255, np.uint8)
    alpha[:, : W // 3] = 0  # a transparent left third: white in the output, not black
    rgba.putalpha(Image.fromarray(alpha))
    put(root, "circles/circle_alpha.png", encode(rgba, "PNG"), ("kept", None))
    cmyk = fresh("triangles").convert("CMYK")
    put(root, "triangles/triangle_cmyk.jpg", jpeg(cmyk, icc_profile=press_cmyk()), ("kept", None))
    UPRIGHT["triangles/triangle_rotated_exif6.jpg"] = upright = fresh("triangles")
    put(root, "triangles/triangle_rotated_exif6.jpg", nasty.exif_rotated(upright, 6, quality=85), ("kept", None))
    put(root, "stripes/stripe_png_named.jpg", encode(fresh("stripes"), "PNG"), ("kept", None))
    grey16 = (np.asarray(fresh("stripes").convert("L")).astype(np.uint16) * 257)
    put(root, "stripes/stripe_16bit.png", nasty.png(grey16, 0, 16), ("kept", None))
    frames = [fresh("circles").convert("P", palette=Image.Palette.ADAPTIVE) for _ in range(2)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=200, loop=0)
    put(root, "circles/circle_animated.gif", gif.getvalue(), ("kept", None))
    # duplicates: same pixels in another container, byte copies, near copies, conflicting labels
    png = encode(c["circles/circle_007.jpg"], "PNG")
    put(root, "circles/circle_007_lossless.png", png)
    put(root, "circles/circle_007_lossless_copy.webp", encode(Image.open(io.BytesIO(png)), "WEBP", lossless=True),
        ("duplicate", "exact_duplicate"))
    put(root, "stripes/stripe_005_copy.jpg", (root / "stripes/stripe_005.jpg").read_bytes(), ("duplicate", "exact_duplicate"))
    near = c["triangles/triangle_005.jpg"]
    put(root, "triangles/triangle_005_q40.jpg", jpeg(near, quality=40), ("duplicate", "near_duplicate"))
    put(root, "triangles/triangle_005_small.jpg", jpeg(near.resize((W * 6 // 10, H * 6 // 10), Image.Resampling.LANCZOS)),
        ("duplicate", "near_duplicate"))
    put(root, "stripes/circle_008_mislabelled.jpg", (root / "circles/circle_008.jpg").read_bytes(), ("conflict", "label_conflict"))
    # junk every real folder has
    put(root, ".DS_Store", b"\x00\x00\x00\x01Bud1" + bytes(rng.integers(0, 256, 500, dtype=np.uint8)),
        ("quarantined", "unsupported_format"))
    put(root, "circles/._circle_000.jpg", b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(200),
        ("quarantined", "unsupported_format"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "raw")
    args = ap.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    generate(args.out)
    n = sum(1 for p in args.out.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {n} files, {size / 1e6:.1f} MB, to {args.out}")


if __name__ == "__main__":
    main()
