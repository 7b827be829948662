"""--labels: the file read right whatever its encoding, every problem reported."""

import json

import pyarrow.parquet as pq
import pytest

from pipeline.clean import stage as clean
from pipeline.clean.labels import normalize_path, read_labels
from pipeline.clean.stage import CleanConfig
from pipeline.core.errors import UsageError
from tests.factories import photo, write


@pytest.fixture
def raw(tmp_path):
    src = tmp_path / "raw"
    photo(src / "img" / "猫1.jpg", seed=1)
    photo(src / "img" / "dog 2.jpg", seed=2)
    photo(src / "img" / "unlisted.jpg", seed=3)
    write(src / "img" / "dog 2.txt", "a dog on the grass")  # caption of dog 2
    return src


def _run(src, out, labels, **kw):
    report = clean.run(CleanConfig(src, out, labels=labels, workers=2, **kw), show_progress=False)
    return report, {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


@pytest.mark.parametrize("encoding,bom", [("gbk", b""), ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe")])
def test_labels_file_in_any_encoding(raw, tmp_path, encoding, bom):
    csv_text = "path,label\r\nimg/猫1.jpg,猫\r\n.\\img\\dog 2.jpg,狗\r\nimg/gone.jpg,猫\r\n"
    labels = write(tmp_path / "labels.csv", bom + csv_text.encode(encoding))
    report, rows = _run(raw, tmp_path / "clean", labels)
    assert rows["img/猫1.jpg"]["label"] == "猫" and rows["img/猫1.jpg"]["status"] == "kept"
    assert rows["img/dog 2.jpg"]["label"] == "狗"
    assert rows["img/dog 2.txt"]["label"] == "狗"  # a caption takes its image's label
    assert (rows["img/unlisted.jpg"]["status"], rows["img/unlisted.jpg"]["reason"]) == ("quarantined", "missing_label")
    notes = report["labels"]
    assert notes["rows"] == 3
    assert notes["rows_naming_missing_files"] == {"count": 1, "first": ["img/gone.jpg"]}
    assert notes["files_without_label"] == {"count": 1, "first": ["img/unlisted.jpg"]}
    assert json.loads((tmp_path / "clean" / "report.json").read_text())["labels"] == notes


def test_jsonl_labels_and_a_labels_file_inside_the_input(raw, tmp_path):
    labels = write(raw / "labels.jsonl", '{"path": "img/猫1.jpg", "label": "cat"}\n\n'
                                         '{"path": "img/dog 2.jpg", "label": "dog"}\n'
                                         '{"path": "img/unlisted.jpg", "label": "cat"}\n')
    report, rows = _run(raw, tmp_path / "clean", labels)
    assert "labels.jsonl" not in rows  # the labels file is not data
    assert {r["label"] for r in rows.values()} == {"cat", "dog"}
    assert report["by_status"]["quarantined"] == 0


def test_conflicting_and_empty_rows_are_reported(tmp_path):
    f = write(tmp_path / "l.csv", "path,label\na.jpg,cat\na.jpg,dog\nb.jpg,\n")
    lab = read_labels(f, tmp_path)
    assert lab.labels == {"a.jpg": "cat"}
    assert lab.notes["conflicting_rows"]["count"] == 1
    assert lab.notes["rows_without_label"] == {"count": 1, "first": ["line 4: b.jpg"]}


@pytest.mark.parametrize("content,message", [
    ("file,class\na.jpg,cat\n", "path,label"),
    ('{"path": "a.jpg"}\n', '"label"'),
    ("{not json\n", "not valid JSON"),
])
def test_bad_labels_files_are_usage_errors(tmp_path, content, message):
    f = write(tmp_path / ("l.jsonl" if content.startswith("{") else "l.csv"), content)
    with pytest.raises(UsageError, match=message):
        read_labels(f, tmp_path)


def test_binary_labels_file_is_a_usage_error(tmp_path, cli):
    f = write(tmp_path / "labels.csv", bytes(range(256)))
    (tmp_path / "raw").mkdir()
    r = cli("clean", tmp_path / "raw", "-o", tmp_path / "out", "--labels", f)
    assert r.exit_code == 2 and "labels file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("raw_path,expected", [("./a/b.jpg", "a/b.jpg"), (".\\a\\b.jpg", "a/b.jpg"),
                                               ("/a.jpg", "a.jpg"), (".hidden/x.jpg", ".hidden/x.jpg")])
def test_paths_are_normalised(raw_path, expected):
    assert normalize_path(raw_path) == expected


def test_text_column_is_a_caption(tmp_path):
    from tests.factories import image_bytes, noise_rgb

    src = tmp_path / "raw"
    same = image_bytes(noise_rgb(200, 150, seed=4), "PNG")
    write(src / "a.png", same)
    write(src / "b.png", same)  # same pixels, other caption: the same picture, a duplicate (issue 14.3)
    write(src / "c.png", same)  # same pixels and caption as a: a duplicate
    photo(src / "d.jpg", seed=8)
    write(src / "d.txt", "the caption file wins")
    photo(src / "e.jpg", seed=9)
    labels = write(tmp_path / "labels.csv", 'path,label,text\n'
                   'a.png,cat,"A cat,\r\nasleep"\nb.png,cat,A dog\nc.png,cat,"A cat,\nasleep"\n'
                   'd.jpg,cat,ignored\ne.jpg,cat,"caf\ufffd"\n'.encode("utf-8"))
    report, rows = _run(src, tmp_path / "clean", labels)
    out = tmp_path / "clean"
    assert rows["a.png"]["status"] == "kept"
    assert (rows["b.png"]["reason"], rows["b.png"]["duplicate_of"]) == ("exact_duplicate", "a.png")
    assert "another caption" in rows["b.png"]["detail"] and not (out / "data" / "b.txt").exists()
    assert (out / "data" / "a.txt").read_text(encoding="utf-8") == "A cat,\nasleep"
    assert "caption from the labels file: data/a.txt" in rows["a.png"]["detail"]
    assert rows["c.png"]["reason"] == "exact_duplicate" and not (out / "data" / "c.txt").exists()
    assert (out / "data" / "d.txt").read_text() == "the caption file wins"
    assert (rows["e.jpg"]["status"], rows["e.jpg"]["reason"]) == ("quarantined", "pair_rejected")
    assert "garbled_text" in rows["e.jpg"]["detail"]
    assert report["labels"]["captions"] == 3
    assert report["labels"]["captions_ignored_for_a_caption_file"]["first"] == ["d.jpg"]
    # a second run changes nothing
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "report.json"}
    _run(src, out, labels)
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "report.json"}


def test_labels_file_caption_reaches_the_shards(tmp_path):
    """A caption given in the labels file has no file of its own: the image row names it, and
    pipe shard packs it as the sample's .txt."""
    import tarfile

    from pipeline.shard import stage as shard
    from pipeline.shard.stage import ShardConfig

    src, out, shards = tmp_path / "raw", tmp_path / "clean", tmp_path / "shards"
    for i in range(6):
        photo(src / f"img{i}.jpg", seed=i)
    lines = ["path,label,text"] + [f"img{i}.jpg,{'ab'[i % 2]},caption number {i}" for i in range(6)]
    write(tmp_path / "labels.csv", "\n".join(lines) + "\n")
    clean.run(CleanConfig(src, out, labels=tmp_path / "labels.csv", workers=1), show_progress=False)
    rows = {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}
    assert rows["img3.jpg"]["caption"] == "data/img3.txt"
    assert (out / "data" / "img3.txt").read_text() == "caption number 3"
    shard.run(ShardConfig(out, shards, val_fraction=0.0), show_progress=False)
    texts = {}
    for tar in sorted(shards.glob("*.tar")):
        with tarfile.open(tar) as t:
            texts.update({m.name: t.extractfile(m).read().decode() for m in t.getmembers() if m.name.endswith(".txt")})
    assert texts["img3.txt"] == "caption number 3"


def test_a_caption_in_the_labels_file_is_bounded_like_a_caption_file(tmp_path):
    """--max-text-bytes holds for the text column too: a caption over it is too_large (its image
    pair_rejected, as with any rejected caption), one at the limit is kept."""
    src = tmp_path / "raw"
    photo(src / "a.jpg", seed=1)
    photo(src / "b.jpg", seed=2)
    photo(src / "c.jpg", seed=3)
    write(tmp_path / "labels.csv", "path,label,text\n"
          f"a.jpg,cat,{'x' * 2000}\nb.jpg,cat,{'é' * 600}\nc.jpg,cat,{'x' * 1000}\n".encode())
    out = tmp_path / "clean"
    clean.run(CleanConfig(input=src, output=out, workers=1, labels=tmp_path / "labels.csv", max_text_bytes="1000"),
              show_progress=False)
    rows = {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}
    assert rows["a.jpg"]["reason"] == "pair_rejected" and "too_large" in rows["a.jpg"]["detail"]
    assert rows["b.jpg"]["reason"] == "pair_rejected" and "1200 bytes > --max-text-bytes 1000" in rows["b.jpg"]["detail"]
    assert rows["c.jpg"]["status"] == "kept" and (out / "data" / "c.txt").read_text() == "x" * 1000


def test_a_caption_cell_over_the_csv_module_s_128_kib_is_judged_not_the_whole_file_refused(tmp_path):
    """Python's csv refuses a cell over 128 KiB by default ("field larger than field limit", the
    whole labels file with it). A 200 KiB caption under --max-text-bytes is a caption like any
    other; a 300 KiB one over it is too_large; the rows after them are read; the csv module's
    limit is the same after the run as before it."""
    import csv

    src = tmp_path / "raw"
    for i, name in enumerate(("a.jpg", "b.jpg", "c.jpg")):
        photo(src / name, seed=i + 1)
    long_ok, too_long = "a cat " * (200 * 1024 // 6), "a cat " * (300 * 1024 // 6)
    write(tmp_path / "labels.csv", (f'path,label,text\na.jpg,cat,"{long_ok}"\nb.jpg,cat,"{too_long}"\n'
                                    "c.jpg,dog,short\n").encode())
    before = csv.field_size_limit()
    out = tmp_path / "clean"
    clean.run(CleanConfig(input=src, output=out, workers=1, labels=tmp_path / "labels.csv", max_text_bytes="256KiB"),
              show_progress=False)
    assert csv.field_size_limit() == before
    rows = {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}
    assert rows["a.jpg"]["status"] == "kept" and (out / "data" / "a.txt").read_text() == long_ok
    assert rows["b.jpg"]["reason"] == "pair_rejected" and "too_large" in rows["b.jpg"]["detail"]
    assert rows["c.jpg"]["status"] == "kept" and rows["c.jpg"]["label"] == "dog"
