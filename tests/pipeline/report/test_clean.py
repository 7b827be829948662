"""`pipe report` on a clean dir: previews only from folders named on the command line (issue 24
item 3), rows checked against their schema, samples counted as samples (issue 25 item 7).

The attacks are built as an attacker with write access to a clean dir would build them: a
report.json whose input is "/", manifest rows naming a credentials file, a kept output that is a
link out of the folder, a FIFO where an output should be.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.formats.manifest import COLUMNS
from tests.check_fixtures import build_raw, run_clean
from tests.clean_dirs import Spec, make_clean_dir
from tests.factories import photo

SECRET = "aws_secret_access_key=TOPSECRET123"


def _rows(*rows: dict) -> pa.Table:
    full = []
    for r in rows:
        base = dict.fromkeys(COLUMNS.names)
        base.update(detail="", bytes=1, sha256="", output="", key="k", kind="image", status="kept")
        base.update(r)
        full.append(base)
    return pa.Table.from_pylist(full, schema=COLUMNS)


def _plant(root: Path, report: dict, *rows: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(_rows(*rows), root / "manifest.parquet")
    (root / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return root


def _report_json(input_path: str, rel: str | None = None) -> dict:
    return {"schema_version": 1, "tool": "pipe", "files": 1, "by_status": {"kept": 0, "duplicate": 1, "quarantined": 0},
            "by_reason": {}, "by_kind": {}, "by_encoding": {}, "kept_by_label": {},
            "settings": {"input": input_path}, "input": {"path": input_path, "from_clean_dir": rel}, "timings": {}}


@pytest.fixture
def secrets(tmp_path) -> tuple[Path, Path]:
    """A credentials file and a private photo somewhere on the disk."""
    home = tmp_path / "home" / "user"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(f"[default]\n{SECRET}\n")
    photo(home / "private.jpg", 64, 48, seed=7)
    return home / ".aws" / "credentials", home / "private.jpg"


def test_a_report_json_pointing_at_the_root_reads_nothing_from_the_disk(tmp_path, secrets):
    """report.json says the input was "/" and rows name the credentials file and a photo, each with
    its true sha256 (the attacker may know them): neither reaches the page, with or without a
    wrong --input, and the page says why there is no preview."""
    from pipeline.report.stage import build

    cred, pic = secrets
    rows = [dict(source=str(p)[1:], status="duplicate", reason="exact_duplicate", duplicate_of="a.jpg", kind=kind,
                 sha256=hashlib.sha256(p.read_bytes()).hexdigest(), bytes=p.stat().st_size, key=f"k{i}")
            for i, (p, kind) in enumerate(((cred, "text"), (pic, "image")))]
    rows.append(dict(source="a.jpg", key="a", output="data/a.jpg", sha256="0" * 64))
    clean = _plant(tmp_path / "clean", _report_json("/"), *rows)
    page = build([clean])
    assert "TOPSECRET" not in page and "data:image/jpeg" not in page
    assert "only in the input folder" in page and "--input" in page
    other = tmp_path / "other"
    other.mkdir()
    page = build([clean], inputs=[other])  # a folder that is not the input: the rows name files not in it
    assert "TOPSECRET" not in page and page.count("data:image/jpeg") == 0


def test_a_kept_output_that_is_a_link_out_or_a_fifo_shows_no_preview(tmp_path, secrets):
    from pipeline.report.stage import build

    cred, pic = secrets
    clean = tmp_path / "clean"
    (clean / "data").mkdir(parents=True)
    (clean / "data" / "a.jpg").symlink_to(pic)
    (clean / "data" / "b.txt").symlink_to(cred)
    (clean / "data" / "c").symlink_to(cred.parent)  # a folder link: data/c/credentials leads out
    os.mkfifo(clean / "data" / "fifo.jpg")
    _plant(clean, _report_json(str(tmp_path / "raw")),
           dict(source="a.jpg", key="a", output="data/a.jpg", sha256="0" * 64, label="x"),
           dict(source="b.txt", key="b", output="data/b.txt", sha256="0" * 64, kind="text", label="x",
                encoding="utf-8", encoding_confidence=1.0, detail="repaired"),
           dict(source="c.txt", key="c", output="data/c/credentials", sha256="0" * 64, kind="text", label="x",
                encoding="utf-8", encoding_confidence=1.0, detail="repaired"),
           dict(source="f.jpg", key="f", output="data/fifo.jpg", sha256="0" * 64, label="x"))
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(build([clean])), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "the report blocked (on the FIFO?)"
    page = done[0]
    assert "TOPSECRET" not in page and "data:image/jpeg" not in page
    assert page.count("not a file inside its folder") >= 3


def test_input_given_on_the_command_line_previews_duplicates_and_says_what_is_gone(tmp_path):
    """The raw folder named with --input is where duplicates are previewed from, each file only if
    its bytes are still those pipe clean read; the page says how many are gone or changed."""
    from pipeline.report.stage import build

    raw = build_raw(tmp_path / "raw", {"cats": 3, "dogs": 3})
    (raw / "cats" / "copy.jpg").write_bytes((raw / "cats" / "cats01.jpg").read_bytes())
    (raw / "cats" / "copy2.jpg").write_bytes((raw / "cats" / "cats02.jpg").read_bytes())
    clean = run_clean(raw, tmp_path / "clean")
    without = build([clean])
    with_input = build([clean], inputs=[raw])
    assert with_input.count("data:image/jpeg") == without.count("data:image/jpeg") + 2  # the two copies
    assert "previewed from" in with_input and "only in the input folder" not in with_input
    (raw / "cats" / "copy.jpg").unlink()  # gone
    (raw / "cats" / "copy2.jpg").write_bytes((raw / "dogs" / "dogs00.jpg").read_bytes())  # another picture now
    page = build([clean], inputs=[raw])
    assert page.count("data:image/jpeg") == without.count("data:image/jpeg")
    assert "no preview: file not found" in page and "no preview: the file changed since pipe clean read it" in page
    assert "not what pipe clean read: 1 gone from it, 1 changed since" in page


def test_a_report_made_from_another_working_folder_finds_the_input(tmp_path, monkeypatch, cli):
    """pipe clean ran with a relative input from one folder; the report runs from another: the
    --input given is recognised as this clean dir's (report.json keeps INPUT resolved and relative
    to CLEAN_DIR), not taken as a moved folder."""
    from pipeline.clean import stage as clean_stage
    from pipeline.report.clean import match_inputs
    from pipeline.storage import open_folder

    work = tmp_path / "work"
    build_raw(work / "raw", {"cats": 2, "dogs": 2})
    monkeypatch.chdir(work)
    clean_stage.run(clean_stage.CleanConfig(Path("raw"), Path("out/clean"), workers=1, size=64), show_progress=False)
    report = json.loads((work / "out" / "clean" / "report.json").read_text())
    assert report["settings"]["input"] == "raw"
    assert report["input"] == {"path": str((work / "raw").resolve()), "from_clean_dir": "../../raw"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (match,) = match_inputs([open_folder(work / "out" / "clean")], [open_folder(Path("../work/raw"))])
    assert match[0] is not None and match[1] is False  # found where report.json says: not "moved"
    moved = tmp_path / "moved"
    (work).rename(moved)  # both folders moved together: the path relative to CLEAN_DIR still finds it
    (match,) = match_inputs([open_folder(moved / "out" / "clean")], [open_folder(moved / "raw")])
    assert match[1] is False
    r = cli("report", moved / "out" / "clean", "--input", moved / "raw", "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.output


def test_an_input_that_is_no_clean_dirs_is_a_usage_error(tmp_path, cli):
    a = make_clean_dir(tmp_path / "a", [Spec("k1", "x")])
    b = make_clean_dir(tmp_path / "b", [Spec("k2", "x")])
    for c, raw in ((a, "/data/raw-a"), (b, "/data/raw-b")):
        (c / "report.json").write_text(json.dumps(_report_json(raw)), encoding="utf-8")
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    r = cli("report", a, b, "--input", tmp_path / "x", "--input", tmp_path / "y", "-o", tmp_path / "r.html")
    assert r.exit_code == 2 and "is the input of none of the clean dirs" in r.stderr
    r = cli("report", a, "--input", tmp_path / "nope", "-o", tmp_path / "r.html")
    assert r.exit_code == 2 and "is not a folder" in r.stderr
    r = cli("report", a, "--input", tmp_path / "x", "-o", tmp_path / "x" / "r.html")  # never write into an input
    assert r.exit_code == 2 and not (tmp_path / "x" / "r.html").exists()


def test_a_row_that_breaks_the_schema_is_named_and_nothing_of_it_shown(tmp_path):
    """A kept row with a reason, a negative width, a text status: each breaks the manifest's
    schema, so its card names what is wrong and shows no value and no preview."""
    from pipeline.report.stage import build

    clean = make_clean_dir(tmp_path / "clean", [Spec("good", "x", seed=1)])
    table = pq.read_table(clean / "manifest.parquet")
    bad = _rows(dict(source="bad1.jpg", key="b1", label="x", output="data/x/good.jpg", reason="corrupt",
                     sha256="0" * 64, width=-5, height=9),
                dict(source="bad2.jpg", key="b2", label="x", status="quarantined", reason="<b>nope</b>",
                     sha256="0" * 64, output=""))
    pq.write_table(pa.concat_tables([table, bad]), clean / "manifest.parquet")
    page = build([clean])
    assert page.count("manifest row breaks its schema") == 2
    assert "-5×9" not in page and "<b>nope" not in page and "&lt;b&gt;nope&lt;/b&gt;" in page  # counted, escaped
    assert page.count("data:image/jpeg") == 1  # the good row's preview only


def test_a_column_of_the_wrong_type_is_left_out_and_said(tmp_path):
    """The reported attack: width as text holding a <meta http-equiv=refresh> (render printed it raw)."""
    from pipeline.report.stage import build

    clean = make_clean_dir(tmp_path / "clean", [Spec("k1", "x")])
    table = pq.read_table(clean / "manifest.parquet")
    meta = '<meta http-equiv="refresh" content="0;url=https://example.com">'
    i = table.column_names.index("width")
    pq.write_table(table.set_column(i, "width", pa.array([meta], pa.string())), clean / "manifest.parquet")
    page = build([clean])
    assert "<meta http-equiv=\"refresh\"" not in page and "example.com" not in page
    assert "column width holds string, not int64: it could not be shown" in page


def test_kept_samples_per_class_count_an_image_and_its_caption_once(tmp_path):
    from pipeline.report.stage import build

    clean = make_clean_dir(tmp_path / "clean", [Spec(f"k{i}", "cats", text="a cat" if i % 2 else None, seed=i)
                                                for i in range(6)] + [Spec("d0", "dogs", seed=9)])
    page = build([clean])
    rows = dict(re.findall(r"<tr><td>([a-z]+)</td><td>(\d+)</td></tr>", page.partition("kept samples per class")[2]))
    assert rows == {"cats": "6", "dogs": "1"}  # 9 kept files of cats (6 images + 3 captions) are 6 samples
    assert "cats: 6 samples kept" in page


def test_a_manifest_or_report_json_that_links_out_of_the_folder_is_not_read(tmp_path):
    """The folder's own files are read only if they are in it: a manifest.parquet linked to another
    dataset's would put that dataset's names and pictures in the page."""
    from pipeline.report.stage import build

    other = make_clean_dir(tmp_path / "other", [Spec("secret_name", "private", seed=3)])
    (other / "report.json").write_text(json.dumps(_report_json("/")), encoding="utf-8")
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "manifest.parquet").symlink_to(other / "manifest.parquet")
    (clean / "report.json").symlink_to(other / "report.json")
    page = build([clean])
    assert "secret_name" not in page and "private" not in page
    for name in ("manifest.parquet", "report.json"):
        assert f"{name} is not a file inside the folder (a link out of it?): not read" in page
