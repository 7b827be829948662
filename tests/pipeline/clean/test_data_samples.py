"""data_samples/: the committed files are what the generator makes, and `pipe clean` gives each
nasty image the verdict data_samples/README.md promises."""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.clean import stage as clean
from pipeline.clean.stage import CleanConfig
from tests.conftest import REPO

RAW = REPO / "data_samples" / "raw"


def load_generator():
    spec = importlib.util.spec_from_file_location("data_samples_generate", REPO / "data_samples" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    gen = load_generator()
    out = tmp_path_factory.mktemp("samples") / "raw"
    gen.generate(out)
    return gen, out


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory):
    out = tmp_path_factory.mktemp("samples") / "clean"
    clean.run(CleanConfig(RAW, out, workers=2), show_progress=False)
    return out, {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


def files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_committed_samples_are_what_the_generator_makes(generated):
    _, out = generated
    want, got = files(out), files(RAW)
    assert sorted(want) == sorted(got), "data_samples/raw is stale: run python data_samples/generate.py"
    assert [f for f in want if want[f] != got[f]] == []
    assert sum(len(v) for v in got.values()) < 4_000_000  # a few MB at most


def test_classes_are_balanced_and_captioned():
    for cls in ("circles", "stripes", "triangles"):
        images = [p for p in (RAW / cls).glob(f"{cls[:-1]}_[0-9][0-9][0-9].jpg")]
        assert 40 <= len(images) <= 60
        assert sum((p.with_suffix(".txt")).exists() for p in images) >= len(images) // 4


def test_each_nasty_image_gets_its_verdict(generated, cleaned):
    gen, _ = generated
    _, rows = cleaned
    assert len(rows) == len(files(RAW))  # one row per file
    for source, (status, reason) in gen.EXPECTED.items():
        if source.endswith(".txt"):
            continue  # texts: tests/test_text*.py
        r = rows[source]
        if status in ("kept", "quarantined"):
            assert (r["status"], r["reason"]) == (status, reason), (source, r["detail"])
        elif reason == "exact_duplicate":
            assert (r["status"], r["reason"]) == ("duplicate", "exact_duplicate"), source
    twin = rows["circles/circle_008.jpg"], rows["stripes/circle_008_mislabelled.jpg"]
    assert not all(r["status"] == "kept" for r in twin), "the same image under two labels was kept twice"


def output(out, rows, source) -> np.ndarray:
    return np.asarray(Image.open(out / rows[source]["output"]).convert("RGB")).astype(int)


def test_odd_images_come_out_right(generated, cleaned):
    gen, _ = generated
    out, rows = cleaned
    alpha = output(out, rows, "circles/circle_alpha.png")
    assert alpha[200:312, 10:80].min() >= 250  # the transparent left third is white, not black
    rotated = output(out, rows, "triangles/triangle_rotated_exif6.jpg")
    source = gen.UPRIGHT["triangles/triangle_rotated_exif6.jpg"]  # 256x192 upright: 512x384 in the pad
    upright = np.asarray(source.resize((512, 384), Image.Resampling.LANCZOS)).astype(int)
    assert np.abs(rotated[64:448] - upright).mean() < 4  # EXIF orientation applied
    assert np.abs(rotated[64:448] - upright[::-1, ::-1]).mean() > 20  # and the check can tell
    cmyk = output(out, rows, "triangles/triangle_cmyk.jpg")
    assert cmyk.shape == (512, 512, 3)
    for source in ("stripes/stripe_16bit.png", "circles/circle_animated.gif", "stripes/stripe_png_named.jpg"):
        im = Image.open(io.BytesIO((out / rows[source]["output"]).read_bytes()))
        assert (im.size, im.mode) == ((512, 512), "RGB"), source
