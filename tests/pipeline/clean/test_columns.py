"""What the driver keeps of every file, and what it reads back on demand: a row's part found from
its index, values fetched a part at a time in any order, columns waiting on the driver's disk,
texts' band keys read a band at a time, and two files called duplicates only when their full
content hashes agree, whatever their 8-byte digests say."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean import columns
from pipeline.clean.columns import Bands, OnDisk, Rows, Strings, compact, leads, locate, to_table
from pipeline.clean.decide import DecideSettings, decide
from pipeline.clean.records import FileResult
from pipeline.similarity.minhash import BANDS, encode_keys

sizes = st.lists(st.integers(0, 7), min_size=1, max_size=8)


def _rows_over(parts: list[int]) -> tuple[Rows, pa.Table, list[int]]:
    """A `Rows` over parts of the given sizes, the whole table it stands for, and how often each part was read."""
    n = sum(parts)
    table = pa.table({"source": [f"f{i}" for i in range(n)], "detail": [None if i % 3 else f"d{i}" for i in range(n)]})
    starts = np.concatenate(([0], np.cumsum(parts))).tolist()
    reads = [0] * len(parts)

    def read(k, names):
        reads[k] += 1
        part = table.slice(starts[k], parts[k])
        return part if names is None else part.select(list(names))

    return Rows(starts, read), table, reads


@given(sizes, st.data())
def test_a_row_is_in_the_part_whose_range_holds_it(parts, data):
    starts = np.concatenate(([0], np.cumsum(parts)))
    n = int(starts[-1])
    rows = np.array(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20)) if n else [], dtype=np.int64)
    got = locate(starts, rows)
    for r, k in zip(rows.tolist(), got.tolist()):
        assert starts[k] <= r < starts[k + 1]


@given(sizes, st.data())
def test_fetch_is_take_on_the_whole_and_reads_each_part_at_most_once(parts, data):
    source, table, reads = _rows_over(parts)
    n = table.num_rows
    rows = data.draw(st.lists(st.integers(0, n - 1), max_size=30)) if n else []
    got = source.fetch(rows, ["detail", "source"])
    assert got.column_names == ["detail", "source"]
    assert got.to_pylist() == table.select(["detail", "source"]).take(pa.array(rows, pa.int64())).to_pylist()
    assert max(reads, default=0) <= 1
    assert [c.num_rows for c in source.chunks()] == parts


@settings(deadline=None)
@given(sizes, st.data())
def test_patched_rows_read_back_patched_everywhere_and_the_rest_as_the_parts_have_them(parts, data):
    source, table, _ = _rows_over(parts)
    n = table.num_rows
    patched = data.draw(st.dictionaries(st.integers(0, n - 1), st.text(max_size=5), max_size=5)) if n else {}
    for r, v in patched.items():
        source.patch(r, {"detail": v})
    want = [patched.get(i, d) for i, d in enumerate(table.column("detail").to_pylist())]
    assert [v for c in source.chunks() for v in c.column("detail").to_pylist()] == want
    rows = data.draw(st.lists(st.integers(0, n - 1), max_size=20)) if n else []
    got = source.fetch(rows, ["source", "detail"])
    assert got.column("detail").to_pylist() == [want[r] for r in rows]
    assert got.column("source").to_pylist() == [f"f{r}" for r in rows]


@given(sizes, st.data())
def test_strings_of_a_few_rows_answer_for_those_rows_and_null_for_none(parts, data):
    source, table, _ = _rows_over(parts)
    n = table.num_rows
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=10)) if n else [], dtype=np.int64)
    s = Strings.of(source, rows, "source")
    asked = np.concatenate((rows, [-1]))
    assert s.take(asked).to_pylist() == [f"f{r}" for r in rows.tolist()] + [None]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.integers(1, 9), st.randoms(use_true_random=False), st.data())
def test_columns_on_disk_read_back_what_parts_wrote_in_any_order(n, part, rnd, data):
    values = np.arange(n, dtype=np.int64) * 7919 - 5
    disk = OnDisk(n, {"v": np.int64})
    disk.SLICE = 4  # many slices, so a row's slice is found among several
    starts = list(range(0, n, part))
    rnd.shuffle(starts)
    for b in starts:
        disk.write("v", b, values[b:b + part])
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=25)) if n else [], dtype=np.int64)
    assert disk.take("v", rows).tolist() == values[rows].tolist()
    assert disk.read("v", 0, n).tolist() == values.tolist()
    disk.drop("v")


def test_band_keys_wait_on_disk_and_are_read_a_band_at_a_time(tmp_path):
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**32, (6, BANDS), dtype=np.uint64).astype("<u4")
    bands = Bands(tmp_path)
    bands.add(np.array([9, 2, 4]), [keys[i].tobytes() for i in (0, 1, 2)])  # parts end in any order
    bands.add(np.array([0, 7]), [keys[i].tobytes() for i in (3, 4)])
    want = {9: 0, 2: 1, 4: 2, 0: 3, 7: 4}
    members = np.array([7, 2, 9])
    got = bands.of(members)
    assert len(got) == 3 and got.shape == (3, BANDS)
    for b in range(BANDS):
        assert got[:, b].tolist() == [int(keys[want[r], b]) for r in members.tolist()]
    with pytest.raises(IndexError):
        got[0, 1]


def test_a_row_whose_band_keys_are_added_again_reads_its_later_ones(tmp_path):
    keys = np.arange(3 * BANDS, dtype="<u4").reshape(3, BANDS)
    bands = Bands(tmp_path)
    bands.add(np.array([0, 5]), [keys[0].tobytes(), keys[1].tobytes()])
    bands.add(np.array([5]), [keys[2].tobytes()])  # the folder prior read row 5 again
    got = bands.of(np.array([5, 0]))
    assert [got[:, b].tolist() for b in range(BANDS)] == [[int(keys[2, b]), int(keys[0, b])] for b in range(BANDS)]


def test_compact_keeps_what_deciding_needs_of_each_file():
    rows = [FileResult("a.jpg", "a", "image", content_hash="x", phash=5, width=3, height=4),
            FileResult("b.txt", "b", "text", content_hash="x", minhash=encode_keys(np.arange(BANDS, dtype=np.uint32))),
            FileResult("c.bin", "c", "other", reason="unsupported_format", content_hash="")]
    t = compact(to_table(rows))
    assert t.column("kind").to_pylist() == [columns.IMAGE, columns.TEXT, columns.KINDS.index("other")]
    assert t.column("reason").to_pylist() == [-1, -1, columns.REASONS.index("unsupported_format")]
    assert t.column("area").to_pylist() == [12, 0, 0]
    assert t.column("flags").to_pylist() == [columns.HAS_CHASH | columns.HAS_PHASH, columns.HAS_CHASH | columns.HAS_MINHASH, 0]
    chash = t.column("chash").to_pylist()
    assert chash[0] == chash[1] != 0 and chash[2] == 0  # equal hashes, equal digests; none, none
    assert np.frombuffer(t.column("minhash")[1].as_py(), "<u4").tolist() == list(range(BANDS))


@given(st.lists(st.sampled_from(["a", "b", "c", None]), max_size=30))
def test_leads_name_the_first_row_of_each_key(keys):
    got = leads(pa.array(keys, pa.string())).tolist()
    assert got == [keys.index(k) for k in keys]


def _img(i: int, h: str, label: str, phash: int) -> FileResult:
    return FileResult(f"{label}/{i:03d}.jpg", f"{label}__{i:03d}", "image", label=label, content_hash=h,
                      width=10 + i % 3, height=10, phash=phash, output=f"data/{label}/{i:03d}.jpg")


def _verdicts(results, **kw):
    o = decide(results, DecideSettings(**kw))
    return [(d.status, d.reason, d.duplicate_of, d.detail) for d in o.decisions], list(o.label_conflicts)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pqrs"), st.sampled_from(["cat", "dog"]), st.integers(0, 3)), max_size=25),
       st.sampled_from(["quarantine", "majority", "first"]))
def test_digests_that_collide_never_make_different_contents_duplicates(files, policy):
    """Every content hash given the same digest: the groups come from the full hashes all the
    same, so every verdict and report entry is the one the true digests give."""
    results = [_img(i, h, label, phash) for i, (h, label, phash) in enumerate(files)]
    want = _verdicts(results, label_conflicts=policy, near_dedup=False)
    real = columns.digest
    columns.digest = lambda values: np.zeros(len(values), dtype=np.uint64)
    try:
        got = _verdicts(results, label_conflicts=policy, near_dedup=False)
    finally:
        columns.digest = real
    assert got == want
