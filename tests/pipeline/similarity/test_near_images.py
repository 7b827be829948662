"""Near-duplicate images: the hash index finds every close pair without comparing all pairs, and
the pixel check accepts edited copies while rejecting distinct pictures that look alike."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean import stage as clean
from pipeline.clean.stage import CleanConfig
from pipeline.similarity.near_images import all_pairs, candidate_pairs, pigeonhole_bands, popcount
from tests.factories import noise_rgb, write
from tests.image_samples import EDITS, LOOKALIKES, encode, natural


def _balanced_hashes(rng, n):
    """Random 64-bit hashes with 32 bits set, like phash (its bit count is fixed)."""
    bits = np.zeros((n, 64), dtype=bool)
    np.put_along_axis(bits, np.argsort(rng.random((n, 64)), axis=1)[:, :32], True, axis=1)
    return bits


def _pack(bits):
    return np.packbits(bits, axis=1).view(">u8").ravel().astype(np.uint64)


def _with_near_copies(rng, n, copies):
    bits = _balanced_hashes(rng, n)
    for t in range(n - copies, n):
        b = bits[rng.integers(0, n - copies)].copy()
        f = int(rng.integers(1, 6))  # swap f ones with f zeros: distance 2f, bit count kept
        b[rng.choice(np.flatnonzero(b), f, replace=False)] = False
        b[rng.choice(np.flatnonzero(~b), f, replace=False)] = True
        bits[t] = b
    return _pack(bits)


@pytest.mark.parametrize("max_distance", [0, 4, 8, 10])
def test_index_finds_exactly_the_pairs_all_pairs_finds(max_distance):
    rng = np.random.default_rng(max_distance)
    h = _with_near_copies(rng, 3000, 300)
    got = candidate_pairs(h, max_distance)
    assert np.array_equal(got, all_pairs(h, max_distance))
    if max_distance >= 8:
        assert len(got) >= 250


def test_index_with_crowded_buckets():
    """Many hashes sharing band values (flat images, near-identical shots) stay exact."""
    rng = np.random.default_rng(3)
    base = _balanced_hashes(rng, 5)
    bits = base[rng.integers(0, 5, 1500)]
    for row in bits:  # small perturbations of five prototypes
        f = int(rng.integers(0, 3))
        row[rng.choice(np.flatnonzero(row), f, replace=False)] = False
        row[rng.choice(np.flatnonzero(~row), f, replace=False)] = True
    h = _pack(bits)
    got = candidate_pairs(h, 6, max_bucket=10_000)
    assert np.array_equal(got, all_pairs(h, 6))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=60), st.integers(0, 12))
def test_index_matches_all_pairs_on_any_hashes(values, d):
    h = np.array(values, dtype=np.uint64)
    assert np.array_equal(candidate_pairs(h, d), all_pairs(h, d))


def _run(src, out, **kw):
    clean.run(CleanConfig(src, out, workers=2, **kw), show_progress=False)
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


@pytest.mark.parametrize("picture", ["natural", "factory_photo"])
def test_edited_copies_are_found(tmp_path, picture):
    im = natural(1) if picture == "natural" else __import__("PIL.Image").Image.fromarray(noise_rgb(640, 480, seed=5))
    src = tmp_path / "raw"
    write(src / "pics" / "a_original.jpg", encode(im, quality=92))
    for name, edit in EDITS.items():
        write(src / "pics" / f"{name}.jpg", encode(edit(im), quality=92))
    got = _run(src, tmp_path / "clean")
    assert got["pics/a_original.jpg"]["status"] == "kept"
    for name in EDITS:
        row = got[f"pics/{name}.jpg"]
        assert (row["status"], row["reason"], row["duplicate_of"]) == ("duplicate", "near_duplicate", "pics/a_original.jpg"), row
        assert "pixel correlation" in row["detail"]


def test_the_largest_copy_is_kept(tmp_path):
    im = natural(2)
    src = tmp_path / "raw"
    write(src / "a_small.jpg", encode(im.resize((320, 240)), quality=90))
    write(src / "b_large.jpg", encode(im, quality=90))
    got = _run(src, tmp_path / "clean")
    assert got["b_large.jpg"]["status"] == "kept"
    assert got["a_small.jpg"]["duplicate_of"] == "b_large.jpg"


@pytest.mark.parametrize("kind", sorted(LOOKALIKES))
def test_distinct_lookalikes_are_not_merged(tmp_path, kind):
    rng = np.random.default_rng(11)
    src = tmp_path / "raw"
    n = 60
    for i in range(n):
        write(src / f"{i:03d}.png", encode(LOOKALIKES[kind](rng, i), "PNG"))
    got = _run(src, tmp_path / "clean")
    merged = [r for r in got.values() if r["reason"] == "near_duplicate"]
    assert len(merged) <= 0.01 * n, [(r["source"], r["duplicate_of"], r["detail"]) for r in merged]


def test_near_dedup_can_be_turned_off(tmp_path):
    im = natural(3)
    src = tmp_path / "raw"
    write(src / "a.jpg", encode(im, quality=92))
    write(src / "b.jpg", encode(im, quality=40))
    got = _run(src, tmp_path / "clean", near_dedup=False)
    assert {r["status"] for r in got.values()} == {"kept"}


@pytest.mark.parametrize("numpy_has_bitwise_count", [True, False])
def test_popcount_counts_bits_with_and_without_numpy_2(monkeypatch, numpy_has_bitwise_count):
    # numpy 1.x (which pyproject allows) has no np.bitwise_count: the fallback must agree
    if not numpy_has_bitwise_count:
        monkeypatch.delattr(np, "bitwise_count", raising=False)
    x = np.random.default_rng(0).integers(0, 2**63, size=(7, 5), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    want = np.array([[bin(int(v)).count("1") for v in row] for row in x])
    np.testing.assert_array_equal(popcount(x), want)
    np.testing.assert_array_equal(popcount(x[:, 2]), want[:, 2])  # a strided 1-D view too


@given(st.integers(0, 70), st.integers(0, 2**64 - 1), st.data())
def test_hashes_within_d_bits_agree_on_one_pigeonhole_band(d, h, data):
    bands = pigeonhole_bands(d)
    assert sum(w for _, w in bands) == 64 and [s for s, _ in bands] == sorted({s for s, _ in bands})
    flips = data.draw(st.lists(st.integers(0, 63), max_size=d, unique=True))
    g = h ^ sum(1 << b for b in flips)
    assert any((h >> s) & ((1 << w) - 1) == (g >> s) & ((1 << w) - 1) for s, w in bands) or len(flips) >= 64
