"""The console summary of `pipe clean`: what a user reads instead of report.json."""

from tests.factories import photo, write


def _rows(stdout: str) -> list[tuple[str, str]]:
    """The summary table's rows as (name, value), in order; a reason keeps its indent."""
    rows = []
    for line in stdout.splitlines():
        cells = line.split("│")
        if len(cells) == 4:  # │ name │ value │
            rows.append((cells[1][1:].rstrip(), cells[2].strip()))
    return rows


def test_duplicates_are_listed_under_duplicate_not_quarantined(cli, tmp_path):
    raw = tmp_path / "raw"
    photo(raw / "cat" / "a.jpg", seed=1)
    (raw / "cat" / "copy.jpg").write_bytes((raw / "cat" / "a.jpg").read_bytes())
    write(raw / "cat" / "broken.jpg", (raw / "cat" / "a.jpg").read_bytes()[:200])
    r = cli("clean", raw, "-o", tmp_path / "out", "--workers", "1")
    assert r.exit_code == 0, r.output
    names = [name for name, _ in _rows(r.stdout)]
    dup, quar = names.index("duplicate"), names.index("quarantined")
    assert names.index("  exact_duplicate") == dup + 1 < quar
    assert names.index("  truncated") == quar + 1


def test_labels_file_problems_are_counted_on_the_console(cli, tmp_path):
    raw = tmp_path / "raw"
    photo(raw / "a.jpg", seed=1)
    photo(raw / "b.jpg", seed=2)
    labels = write(tmp_path / "labels.csv", "path,label\na.jpg,cat\na.jpg,dog\ngone.jpg,cat\nlost.jpg,dog\n")
    r = cli("clean", raw, "-o", tmp_path / "out", "--labels", labels, "--workers", "1")
    assert r.exit_code == 0, r.output
    rows = dict(_rows(r.stdout))
    assert rows["  rows naming missing files"] == "2"
    assert rows["  re-labelled rows (first kept)"] == "1"
    assert rows["  files no row names"] == "1"  # b.jpg


def test_kept_is_said_in_files_and_in_samples_as_pipe_shard_counts_them(cli, tmp_path):
    """An image and its caption file are two kept files and one sample; a caption alone is a sample
    of its own; a copy is no sample. The table and report.json say both, and pipe shard's samples
    (with those it leaves out) add up to the samples said here."""
    import json

    raw = tmp_path / "raw"
    for i in range(4):
        photo(raw / "cat" / f"p{i}.jpg", seed=i)
        write(raw / "cat" / f"p{i}.txt", f"a cat, picture number {i}")
    photo(raw / "dog" / "d.jpg", seed=9)
    (raw / "dog" / "copy.jpg").write_bytes((raw / "dog" / "d.jpg").read_bytes())
    write(raw / "dog" / "note.txt", "a dog's note without a picture")
    r = cli("clean", raw, "-o", tmp_path / "clean", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert dict(_rows(r.stdout))["kept"] == "10 files = 6 samples"
    report = json.loads((tmp_path / "clean" / "report.json").read_text())
    assert report["by_status"]["kept"] == 10 and report["kept_samples"] == 6
    r = cli("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["train"] + s["val"] + s["unlabelled"] == 6
