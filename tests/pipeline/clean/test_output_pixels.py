"""pipe clean records, for each kept image, its output's size and exact pixel sums (of the pixels
it encoded: for a lossy format, before the encode), so pipe shard need not decode it again; a
part's results written by an older pipe (without those numbers) are redone rather than trusted."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.clean import stage as clean
from pipeline.clean.stage import CleanConfig
from pipeline.formats.pixels import BEFORE_ENCODING, MANIFEST_KEY
from pipeline.formats.sample import decode_image
from pipeline.media.image.decode import Target, decode
from pipeline.media.image.resize import fit
from tests.factories import photo, write

NEW_FIELDS = ("output_width", "output_height", "pixel_sums", "pixel_squares")


def run(src: Path, out: Path, **kw) -> dict:
    return clean.run(CleanConfig(src, out, workers=1, size=40, **kw), show_progress=False)


def rows(out: Path) -> dict[str, dict]:
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


@pytest.fixture
def raw(tmp_path) -> Path:
    src = tmp_path / "raw"
    for i in range(3):
        photo(src / "cats" / f"c{i}.jpg", 90, 70, seed=i)
    photo(src / "cats" / "c1_copy.jpg", 90, 70, seed=1)  # a duplicate: not kept, no numbers
    write(src / "cats" / "c0.txt", "a grey cat")
    return src


@pytest.mark.parametrize("fmt", ["jpg", "webp", "png"])
def test_kept_images_carry_the_sums_of_the_pixels_they_were_encoded_from(raw, tmp_path, fmt):
    """Measured before the encode, not by decoding the output again (issue 26): for PNG the
    numbers a reader's decode gives, for JPEG and WebP those of the pixels encoded, close to a
    reader's; the manifest says so."""
    out = tmp_path / "clean"
    run(raw, out, format=fmt)
    got = rows(out)
    for r in got.values():
        if r["status"] != "kept" or r["kind"] != "image":
            assert all(r[f] is None for f in NEW_FIELDS), r
            continue
        image = decode((raw / r["source"]).read_bytes(), Target(size=40)).image
        encoded = np.asarray(fit(image, 40, "pad", (255, 255, 255))).reshape(-1, 3).astype(np.uint64)
        assert (r["output_width"], r["output_height"]) == (40, 40)
        assert r["pixel_sums"] == encoded.sum(axis=0).tolist()
        assert r["pixel_squares"] == (encoded * encoded).sum(axis=0).tolist()
        px = decode_image((out / r["output"]).read_bytes(), fmt).reshape(-1, 3).astype(np.uint64)
        if fmt == "png":
            assert r["pixel_sums"] == px.sum(axis=0).tolist()
            assert r["pixel_squares"] == (px * px).sum(axis=0).tolist()
        else:  # each channel's mean within 2 levels of the decoded output's (at 40 px q90's chroma
            # subsampling moves it by ~1 level; over 512 px photos by ~0.05: README)
            assert np.abs(np.array(r["pixel_sums"]) - px.sum(axis=0).astype(np.int64)).max() < 2 * 40 * 40
    assert sum(r["pixel_sums"] is not None for r in got.values()) == 3
    metadata = pq.read_schema(out / "manifest.parquet").metadata
    assert metadata[MANIFEST_KEY] == BEFORE_ENCODING.encode()


def test_a_journal_line_of_an_older_pipe_is_redone_not_trusted(raw, tmp_path):
    """(The journal became the parts' results files: a result without the numbers is redone.)"""
    import pyarrow as pa

    out = tmp_path / "clean"
    run(raw, out)
    first = rows(out)
    for part in (out / ".pipe" / "parts").iterdir():
        with pa.ipc.open_file(part) as f:
            table = f.read_all()
        for name in NEW_FIELDS:  # what a pipe before these fields recorded
            i = table.schema.get_field_index(name)
            table = table.set_column(i, table.schema.field(i), pa.nulls(table.num_rows, table.schema.field(i).type))
        with pa.ipc.new_file(part, table.schema) as w:
            w.write_table(table)
    report = run(raw, out)
    images_written = sum(r["kind"] == "image" and r["status"] in ("kept", "duplicate") for r in first.values())
    assert report["reused"] == report["files"] - images_written  # the texts' lines still serve
    assert rows(out) == first
