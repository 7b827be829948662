"""A manifest pipe clean would never write is refused with the one-line reason it always got,
naming the first wrong key in key order, though the rows are now checked as whole columns."""

import pytest

from pipeline.core.errors import UsageError
from pipeline.shard import samples
from tests.clean_dirs import Spec, make_clean_dir


def row(**kw) -> dict:
    from tests.clean_dirs import _row

    return _row(**kw)


def manifest(tmp_path, *extra):
    specs = [Spec(f"k{i}", "cat", seed=i, text="a caption" if i % 2 else None) for i in range(6)]
    return make_clean_dir(tmp_path / "clean", specs, extra_rows=list(extra))


BAD = {
    "two images": ([row(source="cat/k1b.jpg", key="k1", kind="image", label="cat", output="data/cat/k0.jpg")],
                   "manifest key 'k1' has 2 kept images and 1 kept texts"),
    "other labels": ([row(source="dog/k2.txt", key="k2", kind="text", label="dog", output="data/cat/k1.txt")],
                     "manifest key 'k2' has rows with different labels ['cat', 'dog']"),
    "outside": ([row(source="cat/k0x.jpg", key="k0x", kind="image", label="cat", output="data/../../etc/passwd")],
                "manifest row for 'cat/k0x.jpg' is kept but has no usable output path ('data/../../etc/passwd')"),
    "no output": ([row(source="cat/k0x.txt", key="k0x", kind="text", label="cat", output="")],
                  "manifest row for 'cat/k0x.txt' is kept but has no usable output path ('')"),
    "not an image": ([row(source="cat/k0x.txt", key="k0x", kind="image", label="cat", output="data/cat/k1.txt")],
                     "data/cat/k1.txt: not a .jpg, .png or .webp image"),
    "missing": ([row(source="cat/k0x.jpg", key="k0x", kind="image", label="cat", output="data/cat/gone.jpg")],
                "data/cat/gone.jpg is listed as kept in the manifest but is missing"),
    "missing caption": ([row(source="cat/k0x.jpg", key="k0x", kind="image", label="cat", output="data/cat/k0.jpg",
                             caption="data/cat/gone.txt")], "data/cat/gone.txt is listed as kept in the manifest but is missing"),
    "unlabelled, two texts": ([row(source="a.txt", key="zz", kind="text", label=None, output="data/x.txt"),
                               row(source="b.txt", key="zz", kind="text", label=None, output="data/y.txt")],
                              "manifest key 'zz' has 0 kept images and 2 kept texts"),
    "other kind": ([row(source="cat/k9.bin", key="k9", kind="other", label="cat", output="data/cat/k0.jpg")],
                   "manifest key 'k9' has 0 kept images and 0 kept texts"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_wrong_manifest_is_refused_with_its_reason(tmp_path, case):
    extra, message = BAD[case]
    clean = manifest(tmp_path, *extra)
    with pytest.raises(UsageError) as err:
        samples.load(clean)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_first_wrong_key_in_key_order_is_named(tmp_path):
    clean = manifest(tmp_path, row(source="cat/k4.jpg", key="k4", kind="image", label="cat", output="data/cat/gone.jpg"),
                     row(source="dog/k2.txt", key="k2", kind="text", label="dog", output="data/cat/k1.txt"))
    with pytest.raises(UsageError, match="manifest key 'k2' has rows with different labels"):
        samples.load(clean)


def test_unlabelled_samples_are_counted_not_checked(tmp_path):
    clean = manifest(tmp_path, row(source="x/k0x.jpg", key="k0x", kind="image", label=None, output="data/gone.jpg"),
                     row(source="x/k0y.jpg", key="k0y", kind="image", label="", output=""))
    got, _ = samples.load(clean)
    assert (len(got), got.unlabelled, got.unlabelled_examples) == (6, 2, ["k0x", "k0y"])


def _columns(got) -> dict:
    """Every value of a `samples.Samples`, as plain Python (whether its columns are mapped from disk or on the heap)."""
    import numpy as np

    arrow = {name: getattr(got, name).cast("large_binary" if name == "meta" else "large_string").to_pylist()
             for name in ("key", "meta", "image", "text")}
    numbers = {name: np.asarray(getattr(got, name)).tolist()
               for name in ("cls", "image_ext", "image_size", "image_mtime", "text_size", "text_mtime", "phash", "has_phash", "pixels")}
    return {**arrow, **numbers, "classes": got.classes, "unlabelled": got.unlabelled, "examples": got.unlabelled_examples}


def test_samples_are_the_same_however_the_manifest_is_read(tmp_path, monkeypatch):
    """A manifest read a few rows at a time (an image and its caption split between two reads),
    and one whose rows are out of key order (read whole), give the samples of one read whole."""
    import pyarrow.parquet as pq

    from tests.clean_dirs import simple_specs

    specs = simple_specs(40, classes=3, text_every=3)
    clean = make_clean_dir(tmp_path / "clean", specs, extra_rows=[row(source="x/k0x.jpg", key="s00007x", kind="image",
                                                                      label=None, output="data/gone.jpg")])
    table = pq.read_table(clean / "manifest.parquet")
    pq.write_table(table.sort_by("key"), clean / "manifest.parquet")  # in key order, as pipe clean writes it
    first = samples.load(clean)[0]
    whole = _columns(first)
    assert len(whole["key"]) == 40 and whole["unlabelled"] == 1
    assert first.spill is not None  # read a batch at a time, its large columns kept on disk
    for batch in (3, 4, 7):  # every way a key's two rows fall on both sides of a read
        monkeypatch.setattr(samples, "ROW_BATCH", batch)
        got = samples.load(clean)[0]
        assert got.spill is not None and _columns(got) == whole
    pq.write_table(table.sort_by([("key", "descending")]), clean / "manifest.parquet")
    got = samples.load(clean)[0]
    assert got.spill is None and _columns(got) == whole  # out of key order: read whole, as before


def test_pairs_only_samples_are_the_same_however_the_manifest_is_read(tmp_path, monkeypatch):
    """--pairs-only leaves the labelled images alone out (counted, the first keys named) whether the
    manifest is read a few rows at a time or whole."""
    import pyarrow.parquet as pq

    from tests.clean_dirs import simple_specs

    clean = make_clean_dir(tmp_path / "clean", simple_specs(40, classes=3, text_every=3))
    table = pq.read_table(clean / "manifest.parquet")
    pq.write_table(table.sort_by("key"), clean / "manifest.parquet")
    first = samples.load(clean, pairs_only=True)[0]
    whole = {**_columns(first), "not_pairs": first.not_pairs, "not_pair_examples": first.not_pair_examples}
    everything = samples.load(clean)[0]
    assert len(first) + first.not_pairs == len(everything) == 40 and first.not_pairs > 0
    assert len(first.not_pair_examples) == 3 and (first.image_ext >= 0).all() and (first.text_size >= 0).all()
    for batch in (3, 7):
        monkeypatch.setattr(samples, "ROW_BATCH", batch)
        got = samples.load(clean, pairs_only=True)[0]
        assert {**_columns(got), "not_pairs": got.not_pairs, "not_pair_examples": got.not_pair_examples} == whole
    pq.write_table(table.sort_by([("key", "descending")]), clean / "manifest.parquet")
    got = samples.load(clean, pairs_only=True)[0]
    assert got.spill is None
    assert {**_columns(got), "not_pairs": got.not_pairs, "not_pair_examples": got.not_pair_examples} == whole
