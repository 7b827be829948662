"""`pipe report` on a run dir someone else wrote (issue 24 item 11): every metrics.jsonl line and
label_issues.parquet row checked against its schema, and the page bounded whatever they hold."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.report.run import Thinner, pick_ranks, thin
from tests.report_fixtures import build_run


def test_a_string_epoch_or_step_is_named_and_left_out_not_an_internal_error(tmp_path, cli):
    run = build_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "val", "step": 40, "epoch": "<b>four</b>", "val_loss": 0.1, "val_acc": 0.9}) + "\n")
        f.write(json.dumps({"kind": "train", "step": "41", "epoch": 4, "loss": 0.1}) + "\n")
        f.write(json.dumps({"kind": "train", "step": 42, "epoch": 4, "loss": "low", "loss_per_rank": ["x"]}) + "\n")
        f.write(json.dumps({"kind": "drift", "step": 43, "rank": "r", "message": "<i>m</i>"}) + "\n")
        f.write("[1, 2]\nnot json\n")
    r = cli("report", run, "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "validation accuracy" in page and "3 validations shown" in page
    assert "metrics.jsonl line 35 breaks schemas/metrics_row.schema.json (epoch:" in page  # the val row
    for n in (36, 37, 38):
        assert f"metrics.jsonl line {n} breaks" in page
    assert "(not a JSON object)" in page and "and 1 more records of metrics.jsonl" in page  # the line not JSON
    assert "1 drift alarm" in page  # the broken one is not counted
    assert "<b>four" not in page and "<i>m</i>" not in page


def test_a_huge_per_rank_list_does_not_make_a_huge_page(tmp_path):
    """200,000 entries a list broke the page (43 MB); past the schema's bound they are left out,
    and within it (2,000 ranks) the charts draw the global line and the few ranks that stand out."""
    from pipeline.report.stage import build

    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step in range(1, 4):
            f.write(json.dumps({"kind": "train", "step": step, "epoch": 1, "loss": 1.0, "loss_per_rank": [1.0] * 200_000,
                                "data_wait_share_per_rank": [0.1] * 200_000}) + "\n")
    page = build([huge])
    assert len(page.encode("utf-8")) < 200_000 and "breaks schemas/metrics_row.schema.json" in page

    many = tmp_path / "many"
    many.mkdir()
    n = 2000
    with open(many / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step in range(1, 21):
            losses = [1.0] * n
            losses[1234], losses[1432] = 3.0, 0.2  # the two ranks that stand out
            waits = [0.05] * n
            waits[77] = 0.9
            f.write(json.dumps({"kind": "train", "step": step, "epoch": 1, "loss": 1.0, "loss_per_rank": losses,
                                "data_wait_share_per_rank": waits}) + "\n")
    page = build([many])
    assert len(page.encode("utf-8")) < 400_000
    assert "rank 1234" in page and "rank 1432" in page and "rank 77" in page
    assert "(7 of 2,000 ranks: those furthest from the global loss)" in page
    assert "(8 of 2,000 ranks: those waiting most for data)" in page


def test_label_issue_rows_are_checked(tmp_path):
    from pipeline.report.stage import build

    run = build_run(tmp_path / "run")
    pq.write_table(pa.table({"rank": [1, 2, 3], "key": ["a", "b c", "d"], "source": ["x.jpg", "y.jpg", "z.jpg"],
                             "split": ["train", "val", "<s>"], "given": ["cat", "dog", "cat"],
                             "suggested": ["dog", "cat", "dog"], "score": [0.3, 0.2, 0.1]}),
                   run / "label_issues.parquet")
    page = build([run])
    assert "Label-issue candidates (3)" in page
    assert page.count("label_issues.parquet row") == 2 and "&lt;s&gt;" not in page.partition("Label-issue")[2]
    assert "no preview: give the clean dir it came from" in page


def test_thinning_keeps_first_and_last_and_at_most_the_bound():
    rows = [{"i": i} for i in range(10_001)]
    t = Thinner(200)
    for r in rows:
        t.offer(r, lambda x: x)
    kept = t.result(lambda x: x)
    assert len(kept) == 200 and kept[0]["i"] == 0 and kept[-1]["i"] == 10_000
    assert [r["i"] for r in kept] == sorted(r["i"] for r in kept)
    assert thin(rows, 200) != [] and len(thin(rows[:50], 200)) == 50


def test_pick_ranks_takes_those_that_stand_out():
    rows = [{"loss": 1.0, "loss_per_rank": [1.0, 5.0, 1.0, 0.0, 1.0]} for _ in range(3)]
    assert pick_ranks(rows, "loss_per_rank", "loss", 2) == [1, 3]
    assert pick_ranks(rows, "loss_per_rank", "loss", 8) == [0, 1, 2, 3, 4]


def test_an_endless_line_is_skipped(tmp_path):
    from pipeline.report import run as run_facts

    run = build_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"kind": "train", "pad": "' + b"x" * (run_facts.MAX_LINE + 10) + b'"}\n')
        f.write(json.dumps({"kind": "train", "step": 99, "epoch": 9, "loss": 0.5}).encode() + b"\n")
    facts = run_facts.gather(run)
    assert facts.train[-1]["step"] == 99
    assert any("longer than" in p for p in facts.problems)


def test_run_files_that_link_out_of_the_folder_are_not_read(tmp_path):
    from pipeline.report.stage import build

    elsewhere = build_run(tmp_path / "elsewhere", drift_host="secret-host")
    pq.write_table(pa.table({"rank": [1], "key": ["k"], "source": ["secret/source.jpg"]}), elsewhere / "label_issues.parquet")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "label_issues.parquet"):
        (run / name).symlink_to(elsewhere / name)
    page = build([run])
    assert "secret" not in page
    for name in ("metrics.jsonl", "label_issues.parquet"):
        assert f"{name} is not a file inside the folder (a link out of it?): not read" in page
