"""Every clean-dir check: a dataset broken in exactly one way fails that check, and only that one."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.check_fixtures import (
    build_raw,
    check,
    copy_dir,
    edit_json,
    failing,
    kept_output,
    manifest_rows,
    policy_file,
    result,
    run_clean,
    write_manifest,
    zero_middle,
)
from tests.factories import image_bytes, noise_rgb, photo, write


@pytest.fixture
def broken(good, tmp_path) -> Path:
    """A private copy of the good clean dir, to break."""
    return copy_dir(good[1], tmp_path / "clean")


def cleaned(tmp_path, **classes_and_extras) -> Path:
    """Clean a freshly built raw folder (for breaks that must go through pipe clean)."""
    raw = build_raw(tmp_path / "raw", classes_and_extras.pop("classes", None))
    for rel, data in classes_and_extras.pop("extra", {}).items():
        write(raw / rel, data)
    return run_clean(raw, tmp_path / "clean")


def test_good_dataset_passes_everything(good):
    _, clean, policy = good
    report = check(clean, policy)
    assert failing(report) == set()
    assert report.exit_code == 0
    assert result(report, "decodes").status == "skip"  # only --deep decodes
    deep = check(clean, policy, deep=True)
    assert failing(deep) == set() and result(deep, "decodes").status == "pass"


@pytest.mark.parametrize("how", ["manifest_row", "report"])
def test_schema(good, broken, how):
    if how == "manifest_row":
        rows = manifest_rows(broken)
        rows[0]["sha256"] = "not-a-sha256"
        write_manifest(broken, rows)
    else:
        edit_json(broken / "report.json", lambda d: d.update(tool=5))
    report = check(broken, good[2])
    assert failing(report) == {"schema"}
    assert ("sha256" if how == "manifest_row" else "tool") in result(report, "schema").message


def test_a_manifest_of_an_older_pipe_clean_passes_with_a_note(good, broken):
    import pyarrow.parquet as pq

    from pipeline.formats.manifest_row import ADDED_LATER

    table = pq.read_table(broken / "manifest.parquet")
    pq.write_table(table.drop_columns(list(ADDED_LATER)), broken / "manifest.parquet")  # as pipe clean wrote it before
    report = check(broken, good[2])
    assert failing(report) == set() and report.exit_code == 0
    message = result(report, "schema").message
    assert "older pipe clean" in message and "re-run pipe clean" in message and "\n" not in message


def test_schema_unreadable_manifest_fails_schema_and_skips_what_needs_it(good, broken):
    (broken / "manifest.parquet").write_bytes(b"PAR1 garbage")
    report = check(broken, good[2])
    assert failing(report) == {"schema"}
    assert "not a readable Parquet" in result(report, "schema").message
    assert result(report, "quarantined_fraction").status == "skip"
    assert report.exit_code == 1


@pytest.mark.parametrize("change", ["added", "removed"])
def test_manifest_matches_input(good, tmp_path, change):
    raw = copy_dir(good[0], tmp_path / "raw")
    if change == "added":
        photo(raw / "dogs" / "late_arrival.jpg", seed=77)
    else:
        (raw / "dogs" / "dogs03.jpg").unlink()
    report = check(good[1], good[2], input=raw)
    assert failing(report) == {"manifest_matches_input"}
    r = result(report, "manifest_matches_input")
    assert ("dogs/late_arrival.jpg" if change == "added" else "dogs/dogs03.jpg") in r.message
    assert r.numbers["not_in_manifest" if change == "added" else "not_in_input"] == 1


def test_manifest_matches_input_names_rows_without_a_source(good, broken):
    """A damaged manifest whose source is null in a row is reported like any other stray row,
    among names of rows that match no input file, not a crash of the check."""
    rows = manifest_rows(broken)
    rows[0]["source"], rows[1]["source"] = None, "nowhere/else.jpg"
    write_manifest(broken, rows)
    r = result(check(broken, good[2], input=good[0]), "manifest_matches_input")
    assert r.status == "fail"
    assert "None: in the manifest, not in the input" in r.examples
    assert r.numbers["not_in_input"] == 2


def test_manifest_matches_input_is_skipped_not_passed_without_the_input(good, broken, tmp_path):
    edit_json(broken / "report.json", lambda d: d["settings"].update(input=str(tmp_path / "gone")))
    shutil.rmtree(broken / ".pipe")
    r = result(check(broken, good[2]), "manifest_matches_input")
    assert r.status == "skip" and "--input" in r.message


@pytest.mark.parametrize("how", ["missing", "unlisted"])
def test_outputs_match_manifest(good, broken, how):
    if how == "missing":
        kept_output(broken).unlink()
    else:
        photo(broken / "data" / "dogs" / "stray.jpg", 64, 64, seed=5)
    report = check(broken, good[2])
    assert failing(report) == {"outputs_match_manifest"}


def test_quarantined_fraction(good, tmp_path):
    clean = cleaned(tmp_path, extra={"dogs/empty1.jpg": b"", "dogs/empty2.jpg": b""})  # 2 of 15 = 13% > 10%
    report = check(clean, good[2])
    assert failing(report) == {"quarantined_fraction"}
    r = result(report, "quarantined_fraction")
    assert r.numbers["quarantined"] == 2 and "zero_bytes 2" in r.message


def test_duplicate_fraction(good, tmp_path):
    dup = (good[0] / "dogs" / "dogs00.jpg").read_bytes()
    clean = cleaned(tmp_path, extra={"dogs/copy1.jpg": dup, "dogs/copy2.jpg": dup})
    report = check(clean, good[2])
    assert failing(report) == {"duplicate_fraction"}
    assert result(report, "duplicate_fraction").numbers["duplicate"] == 2


def test_min_samples_per_class(good, tmp_path):
    clean = cleaned(tmp_path, classes={"cats": 6, "dogs": 6, "birds": 3})  # 3 < 4; 6/3 = 2 <= 3
    report = check(clean, good[2])
    assert failing(report) == {"min_samples_per_class"}
    assert "'birds' has 3" in result(report, "min_samples_per_class").message


def test_image_and_caption_count_as_one_sample(good):
    r = result(check(good[1], good[2]), "min_samples_per_class")
    assert r.numbers["smallest"] == 6  # cats: 6 images, one with a caption: 6 samples, not 7


def test_class_imbalance(good, tmp_path):
    clean = cleaned(tmp_path, classes={"cats": 6, "dogs": 19})  # 19/6 = 3.2 > 3
    report = check(clean, good[2])
    assert failing(report) == {"class_imbalance"}
    assert result(report, "class_imbalance").numbers["ratio"] == pytest.approx(19 / 6, abs=1e-3)


def test_class_imbalance_as_a_warning_does_not_fail_the_run(good, tmp_path):
    clean = cleaned(tmp_path, classes={"cats": 6, "dogs": 19})
    report = check(clean, policy_file(tmp_path, "max_class_imbalance = 3.0\nmin_samples_per_class = 4\n"))
    r = result(report, "class_imbalance")
    assert (r.status, r.severity, report.exit_code) == ("fail", "warning", 0)


def test_labels_in_range_unlabelled_file_in_labelled_dataset(good, tmp_path):
    clean = cleaned(tmp_path, extra={"stray.jpg": image_bytes(noise_rgb(80, 60, seed=99))})
    report = check(clean, good[2])
    assert failing(report) == {"labels_in_range"}
    assert "stray.jpg" in result(report, "labels_in_range").message


def test_labels_in_range_against_the_policys_classes(good, tmp_path):
    policy = policy_file(tmp_path, good[2].read_text().replace("[severity]", 'classes = ["cats", "dogs", "owls"]\n\n[severity]'))
    report = check(good[1], policy)
    assert failing(report) == {"labels_in_range"}
    assert "'owls'" in result(report, "labels_in_range").message


def test_keys_unique(good, broken):
    rows = manifest_rows(broken)
    dogs = [r for r in rows if r["label"] == "dogs" and r["status"] == "kept"]
    dogs[1]["key"] = dogs[0]["key"]
    write_manifest(broken, rows)
    report = check(broken, good[2])
    assert failing(report) == {"keys_unique"}
    assert dogs[0]["key"] in result(report, "keys_unique").message


def test_image_size(good, broken):
    out = kept_output(broken)
    out.write_bytes(image_bytes(noise_rgb(48, 48, seed=3)))
    report = check(broken, good[2])
    assert failing(report) == {"image_size"}
    assert "48x48" in result(report, "image_size").message


def test_image_size_from_the_policy_overrides_the_declared_size(good, tmp_path):
    report = check(good[1], policy_file(tmp_path, good[2].read_text().replace("[severity]", "image_size = 128\n\n[severity]")))
    assert failing(report) == {"image_size"}


def test_image_mode(good, broken):
    out = kept_output(broken)
    out.write_bytes(image_bytes(Image.fromarray(noise_rgb(64, 64, seed=3)).convert("L")))
    report = check(broken, good[2])
    assert failing(report) == {"image_mode"}
    assert "mode L" in result(report, "image_mode").message


@pytest.mark.parametrize("data, why", [
    ("一只灰猫".encode("gbk"), "not valid UTF-8"),
    ("cafe\u0301".encode("utf-8"), "NFC"),
    (b"\xef\xbb\xbfa cat", "byte-order mark"),
    (b"a cat\r\non a sofa", "\\r"),
])
def test_text_encoding(good, broken, data, why):
    kept_output(broken, "text", "cats").write_bytes(data)
    report = check(broken, good[2])
    assert failing(report) == {"text_encoding"}
    assert why in result(report, "text_encoding").message


def test_decodes_only_with_deep(good, broken):
    out = kept_output(broken)
    data = out.read_bytes()
    out.write_bytes(data[: len(data) // 2])  # header intact: size and mode still read fine
    fast = check(broken, good[2])
    assert failing(fast) == set() and result(fast, "decodes").status == "skip"
    deep = check(broken, good[2], deep=True)
    assert failing(deep) == {"decodes"}
    assert out.name in result(deep, "decodes").message


def test_decodes_deep_finds_damaged_jpeg_data_pillow_accepts(good, broken):
    """Zeroed entropy-coded data: Pillow decodes it to grey blocks without an error, `pipe clean`'s
    strict decode calls it corrupt; --deep must agree with pipe clean and name the file."""
    outs = sorted(broken.joinpath(r["output"]) for r in manifest_rows(broken) if r["status"] == "kept" and r["kind"] == "image")
    out, bad = next((o, b) for o in outs if (b := zero_middle(o.read_bytes())) is not None)
    out.write_bytes(bad)
    assert failing(check(broken, good[2])) == set()  # headers only: nothing to see
    deep = check(broken, good[2], deep=True)
    assert failing(deep) == {"decodes"}
    msg = result(deep, "decodes").message
    assert out.name in msg and "corrupt" in msg and "premature end of data segment" in msg


def test_report_that_is_not_an_object_fails_schema_without_crashing_other_checks(good, broken):
    (broken / "report.json").write_text("[1, 2, 3]")
    report = check(broken, good[2])
    assert failing(report) == {"schema"}
    assert not any("crashed" in r.message for r in report.results)


def test_deep_decoding_in_worker_processes_finds_the_same(good, broken, monkeypatch):
    from pipeline.check import clean_dir

    monkeypatch.setattr(clean_dir, "IN_PROCESS_FILES", 0)
    monkeypatch.setattr(clean_dir, "CHUNK", 3)
    out = kept_output(broken)
    out.write_bytes(out.read_bytes()[: len(out.read_bytes()) // 2])
    report = check(broken, good[2], deep=True, workers=2)
    assert failing(report) == {"decodes"}
    assert result(report, "image_size").numbers["checked"] == 12


def _copy_image(clean: Path, src_source: str, dest_source: str, how: str) -> None:
    """Make the kept image ``dest_source`` a copy of ``src_source``: its output, content hash and
    perceptual hash (exact), or a re-encode of it with the same perceptual hash (near)."""
    rows = manifest_rows(clean)
    by = {r["source"]: r for r in rows}
    src, dest = by[src_source], by[dest_source]
    data = (clean / src["output"]).read_bytes()
    if how == "near":
        data = image_bytes(Image.open(io.BytesIO(data)), quality=60)
    (clean / dest["output"]).write_bytes(data)
    dest["phash"], dest["width"], dest["height"] = src["phash"], src["width"], src["height"]
    dest["content_hash"] = src["content_hash"] if how == "exact" else "f" * 32
    write_manifest(clean, rows)


@pytest.mark.parametrize("how", ["exact", "near"])
def test_duplicates_among_kept_samples_fail_a_caption_hides_none(good, broken, how):
    """Issue 14.3: a kept copy of a captioned image (pipe clean used to keep them) fails the check."""
    _copy_image(broken, "cats/cats00.jpg", "cats/cats01.jpg", how)  # cats00 has a caption
    report = check(broken, good[2])
    assert failing(report) == {"duplicates"}
    r = result(report, "duplicates")
    assert r.numbers["found"] == 1 and "cats/cats01.jpg ~ cats/cats00.jpg" in r.message
    assert ("exact" if how == "exact" else "bits apart") in r.message


@pytest.mark.parametrize("how", ["exact", "near"])
def test_one_content_kept_under_two_labels_fails_label_conflicts(good, broken, how):
    _copy_image(broken, "cats/cats00.jpg", "dogs/dogs00.jpg", how)
    report = check(broken, good[2])
    assert failing(report) == {"label_conflicts"}
    assert "(dogs) ~ cats/cats00.jpg (cats)" in result(report, "label_conflicts").message


def test_duplicates_within_the_policys_allowance_pass(good, broken, tmp_path):
    _copy_image(broken, "dogs/dogs01.jpg", "dogs/dogs02.jpg", "exact")
    policy = policy_file(tmp_path, good[2].read_text().replace("[severity]", "max_duplicate_samples = 1\n\n[severity]"))
    r = result(check(broken, policy), "duplicates")
    assert r.status == "pass" and r.numbers["found"] == 1 and r.examples


@pytest.mark.parametrize("in_workers", [False, True])
def test_near_duplicate_texts_kept_twice_fail_duplicates(tmp_path, monkeypatch, in_workers):
    """Texts alone are compared as texts (a clean with --no-near-dedup keeps these), in worker
    processes when there are many, with the same result."""
    from pipeline.check import clean_dir
    from tests.clean_dirs import Spec, make_clean_dir

    a = "A black cat sitting on a red sofa in the living room, looking at the camera."
    specs = [Spec("t0", "cats", image=False, text=a), Spec("t1", "cats", image=False, text=a[:-1] + "!"),
             Spec("t2", "cats", image=False, text="A brown dog running across a green park after a ball.")]
    clean = make_clean_dir(tmp_path / "clean", specs)
    if in_workers:
        monkeypatch.setattr(clean_dir, "IN_PROCESS_FILES", 1)
        monkeypatch.setattr(clean_dir, "CHUNK", 1)
    r = result(check(clean, policy_file(tmp_path), workers=2), "duplicates")
    assert r.status == "fail" and r.numbers["found"] == 1
    assert "cats/t1.txt ~ cats/t0.txt (text," in r.message
