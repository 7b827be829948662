"""`pipe report`: what a user sees matches the data, and the page is safe and self-contained."""

from __future__ import annotations

import base64
import hashlib
import html as htmllib
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.report_fixtures import SCRIPT_NAME, build_all, build_run, page_counts


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def page(folders, tmp_path_factory):
    from pipeline.report.stage import ReportConfig, run

    out = tmp_path_factory.mktemp("page") / "report.html"
    run(ReportConfig([folders["clean"], folders["shards"], folders["run"]], out))
    return out.read_text(encoding="utf-8")


def test_counts_on_the_page_are_report_json_counts(folders, page):
    report = json.loads((folders["clean"] / "report.json").read_text(encoding="utf-8"))
    counts = page_counts(page)
    assert counts["files"] == report["files"]
    for name, key in (("status", "by_status"), ("reason", "by_reason"), ("kind", "by_kind")):
        shown = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith(name + ":")}
        assert shown == report[key], name
    index = json.loads((folders["shards"] / "index.json").read_text(encoding="utf-8"))
    assert counts["samples:train"] == index["counts"]["train"]["samples"]
    assert counts["samples:val"] == index["counts"]["val"]["samples"]
    assert "disagrees" not in page


def test_every_image_has_alt_text_and_is_inline(page):
    imgs = re.findall(r"<img\b[^>]*>", page)
    assert imgs, "the fixture's kept images should have previews"
    for tag in imgs:
        assert re.search(r'\balt="[^"]+"', tag), tag
        assert re.search(r'\bsrc="data:image/jpeg;base64,[A-Za-z0-9+/=]+"', tag), tag[:80]


def test_nothing_external_is_referenced(page):
    assert "data:image/jpeg;base64," in page
    page = re.sub(r"data:image/jpeg;base64,[A-Za-z0-9+/=]+", "data:", page)  # base64 holds "/" too
    assert "http:" not in page and "https:" not in page and "//" not in page
    assert not re.search(r"<(script|link|iframe|object|embed|base)\b", page, re.IGNORECASE)
    assert "url(" not in page
    assert all(v.startswith("data:") for v in re.findall(r'\b(?:src|href)="([^"]*)"', page))
    # no inline style but the page's own sheet, allowed by its hash (stricter than 'unsafe-inline')
    (sheet,) = re.findall(r"<style>(.*?)</style>", page, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(sheet.encode("utf-8")).digest()).decode()
    assert (f"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; style-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'\"") in page
    assert "unsafe-inline" not in page and ' style="' not in page


def test_every_chart_has_a_text_alternative(page):
    svgs = re.findall(r"<svg\b.*?</svg>", page, re.DOTALL)
    assert len(svgs) >= 5
    for svg in svgs:
        assert 'role="img"' in svg and "aria-label=" in svg and "<title>" in svg and "<desc>" in svg


def test_hostile_names_come_out_escaped(page):
    assert "<script" not in page
    assert htmllib.escape(SCRIPT_NAME, quote=True) in page  # &lt;script&gt;alert(1)&quot;q&#x27;.jpg
    assert "\u202e" not in page  # the override itself never reaches the page ...
    assert 'gpj<span class="esc">\\u202e</span>exe.jpg' in page  # ... it is shown as a visible escape
    assert "bad\\xff\\xfename.jpg" in page  # undecodable bytes of a name, as pipe clean recorded them
    assert "&lt;b&gt;node" in page and "<b>node" not in page  # a drift alarm's host name
    assert not re.search("[\ud800-\udfff\ufffd]", page)


def test_what_was_thrown_away_is_shown_with_why(page):
    assert "decompression_bomb" in page and "no preview: decompression_bomb" in page
    assert "zero_bytes" in page and "the file is empty" in page
    assert "garbled_text" in page or "binary_content" in page or "undecodable_text" in page
    assert "kept copy" in page and "exact copy" in page  # the duplicate cluster, kept copy first
    assert "猫" in page  # a Chinese class name, as it is (no escaping needed)
    assert "一只灰色的猫" in page  # the GBK caption, decoded, as written out


def test_a_rerun_writes_the_same_bytes(folders, tmp_path):
    from pipeline.report.stage import ReportConfig, run

    a, b = tmp_path / "a.html", tmp_path / "b.html"
    run(ReportConfig([folders["clean"], folders["shards"], folders["run"]], a))
    run(ReportConfig([folders["clean"], folders["shards"], folders["run"]], b))
    assert a.read_bytes() == b.read_bytes()


def test_no_thumbnails_copies_no_data_into_the_page(folders, tmp_path, cli):
    out = tmp_path / "r.html"
    r = cli("report", folders["clean"], folders["shards"], "-o", out, "--no-thumbnails")
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    assert "<img" not in page and "data:image" not in page and 'class="snip"' not in page
    assert "一只灰色的猫" not in page
    assert page_counts(page)["files"] == json.loads((folders["clean"] / "report.json").read_text())["files"]


def test_label_issue_candidates_appear_only_when_pipe_labels_wrote_them(tmp_path):
    from pipeline.report.stage import build

    run = build_run(tmp_path / "run")
    assert "Label-issue candidates" not in build([run])
    pq.write_table(pa.table({"key": ["a", "b"], "source": ["cats/1.jpg", "<i>x</i>.jpg"], "split": ["train", "val"],
                             "given": ["cat", "dog"], "suggested": ["dog", "cat"], "score": [0.1, 0.2], "rank": [2, 1]}),
                   run / "label_issues.parquet")
    page = build([run])
    assert "Label-issue candidates (2)" in page and "&lt;i&gt;x&lt;/i&gt;.jpg" in page
    assert page.index("&lt;i&gt;x") < page.index("cats/1.jpg")  # lowest rank first


def test_run_dir_shows_loss_per_rank_and_drift(page):
    assert "training loss per rank" in page and "rank 0" in page and "rank 1" in page
    assert "learning rate" in page and "data-wait share" in page and "validation accuracy" in page
    assert "1 drift alarm" in page


def test_a_validation_row_without_a_step_is_left_out_not_a_crash(tmp_path):
    """A metrics.jsonl another tool appended to (or edited by hand) may have a val row with no
    step or epoch: the chart shows the rows it can place instead of the page failing."""
    from pipeline.report.stage import build

    run = build_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "val", "val_loss": 0.5, "val_acc": 0.9}) + "\n")
    page = build([run])
    assert "validation accuracy" in page and "3 validations shown" in page


def test_folders_that_are_not_ours_are_usage_errors(tmp_path, cli, folders):
    r = cli("report", tmp_path, "-o", tmp_path / "r.html")
    assert r.exit_code == 2 and "nor a run dir" in r.stderr
    r = cli("report", folders["clean"], "-o", folders["clean"] / "data" / "r.html")
    assert r.exit_code == 2 and "inside" in r.stderr
    assert not (folders["clean"] / "data" / "r.html").exists()


def test_check_html_puts_the_verdicts_on_top(folders, tmp_path, cli):
    out = tmp_path / "check.html"
    r = cli("check", folders["clean"], folders["shards"], "--html", out)
    page = out.read_text(encoding="utf-8")
    assert r.exit_code in (0, 1)
    assert ("PASSED" if r.exit_code == 0 else "FAILED") in page
    assert page.index("pipe check") < page.index("Verdict and counts")
    assert "quarantined_fraction" in page


def test_a_hundred_thousand_classes_do_not_make_a_huge_page(tmp_path):
    """Tables and charts are bounded; the counts stay complete."""
    from pipeline.formats.manifest import COLUMNS
    from pipeline.report.stage import build

    n = 100_000
    rows = {c: [None] * n for c in COLUMNS.names}
    rows.update(source=[f"c{i}/{i}.jpg" for i in range(n)], label=[f"c{i}" for i in range(n)], kind=["image"] * n,
                status=["kept"] * n, output=[f"data/c{i}/{i}.jpg" for i in range(n)], width=[64] * n, height=[48] * n)
    root = tmp_path / "clean"
    root.mkdir()
    pq.write_table(pa.table(rows, schema=COLUMNS), root / "manifest.parquet")
    page = build([root])
    assert len(page.encode("utf-8")) < 1_000_000
    assert page_counts(page)["files"] == n and page_counts(page)["status:kept"] == n
    assert "99,800 more" in page and "Classes (100,000)" in page


def test_pipe_report_imports_neither_torch_nor_pandas(folders, tmp_path):
    """pandas alone would cost ~2 s of a report that otherwise takes one or two."""
    import subprocess
    import sys

    from tests.conftest import pipe_env

    out = tmp_path / "r.html"
    code = ("import sys; from pathlib import Path; from pipeline.report.stage import ReportConfig, run; "
            f"run(ReportConfig([Path({str(folders['clean'])!r}), Path({str(folders['shards'])!r}), "
            f"Path({str(folders['run'])!r})], Path({str(out)!r}))); "
            "assert 'torch' not in sys.modules, 'torch imported'; assert 'pandas' not in sys.modules, 'pandas imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())
    assert out.is_file()


def test_a_manifest_with_odd_types_still_gives_a_page(tmp_path):
    """A manifest another tool wrote (sizes as text, a status column of numbers) is shown as far
    as it can be, with what could not be, instead of crashing the report."""
    from pipeline.report.stage import build

    root = tmp_path / "clean"
    root.mkdir()
    pq.write_table(pa.table({"source": ["a.jpg", "b.jpg"], "status": [1, 2], "kind": ["image", "image"],
                             "width": ["wide", "x"], "height": ["tall", "y"]}), root / "manifest.parquet")
    page = build([root])
    assert 'data-count="files">2<' in page
    assert "could not be shown" in page


def test_a_contrastive_run_shows_zero_shot_and_recall_curves_and_its_mismatched_pairs(tmp_path):
    """A run of --objective contrastive (issue 22): its val rows carry zero-shot accuracy and
    recall@K, charted; pipe labels' rows are mismatched image-caption pairs, shown as such."""
    from pipeline.report.stage import build

    run = build_run(tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if r["kind"] == "val":
            r.update({"val_zeroshot_acc": 0.5 + r["epoch"] / 10, "val_recall_i2t@1": 0.3, "val_recall_i2t@5": 0.7,
                      "val_recall_t2i@1": 0.25, "val_recall_t2i@5": 0.65})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (run / "config.json").write_text(json.dumps({"objective": "contrastive", "model": "clip"}), encoding="utf-8")
    pq.write_table(pa.table({"key": ["a"], "source": ["red/r1.png"], "split": ["train"], "given": ["a photo of a <b>blue</b>."],
                             "suggested": [""], "score": [12.5], "rank": [1]}), run / "label_issues.parquet")
    page = build([run])
    assert "zero-shot accuracy and recall@K" in page, page[-3000:]
    assert "image-&gt;text R@5" in page
    assert "80%" in page
    assert "Mismatched image-caption pairs (1)" in page and "Label-issue candidates" not in page
    assert "a photo of a &lt;b&gt;blue&lt;/b&gt;." in page and "red/r1.png" in page


def test_label_issue_candidates_show_their_images_from_the_clean_dir_given(folders, tmp_path):
    """The one place a user must look at images: each candidate with its picture, found by its key
    (and source) in a clean dir on the command line; without one the table says what to add."""
    import shutil

    from pipeline.report.stage import build

    run = tmp_path / "run"
    shutil.copytree(folders["run"], run)
    rows = pq.read_table(folders["clean"] / "manifest.parquet").to_pylist()
    images = [r for r in rows if r["kind"] == "image" and r["status"] == "kept"][:2]
    pq.write_table(pa.table({"rank": [1, 2, 3], "key": [images[0]["key"], images[1]["key"], "elsewhere"],
                             "source": [images[0]["source"], "not/the/same.jpg", ""], "split": ["train"] * 3,
                             "given": ["a"] * 3, "suggested": ["b"] * 3, "score": [0.3, 0.2, 0.1]}), run / "label_issues.parquet")
    table = build([folders["clean"], run]).partition("Label-issue candidates (3)")[2]
    assert table.count("<img") == 1  # the second row's source is another file's: no picture rather than a wrong one
    assert table.count('aria-label="no preview: not in the clean dirs given"') == 2
    alone = build([run]).partition("Label-issue candidates (3)")[2]
    assert "<img" not in alone and alone.count('aria-label="no preview: give the clean dir it came from"') == 3
