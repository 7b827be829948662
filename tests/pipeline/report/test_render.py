"""The page renders only escaped values (issue 24 item 7): markup planted in any field of any
file a report reads stays text, and the content-security policy leaves no second way in."""

from __future__ import annotations

import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from tests.clean_dirs import Spec, make_clean_dir
from tests.report_fixtures import build_all, build_run

PAYLOADS = ['<meta http-equiv="refresh" content="0;url=https://evil.example/">', "<style>body{display:none}</style>",
            '"><img src=x onerror=alert(1)>', "<svg onload=alert(1)>", "</code></figcaption></figure></section><h1>"]


def _hostile_clean(root):
    p = PAYLOADS
    clean = make_clean_dir(root, [Spec(f"k{i}", p[i % len(p)], text=p[(i + 1) % len(p)], seed=i) for i in range(5)])
    table = pq.read_table(clean / "manifest.parquet").to_pylist()
    for i, row in enumerate(table):
        row.update(source=f"{p[i % len(p)]}/{i}.jpg", detail=p[(i + 2) % len(p)],
                   encoding=p[(i + 3) % len(p)] if row["kind"] == "text" else None)
    table.append({**table[0], "source": p[0] + "dup.jpg", "status": "duplicate", "reason": "exact_duplicate",
                  "duplicate_of": table[0]["source"], "output": "", "key": "kdup"})
    from pipeline.formats.manifest import COLUMNS

    pq.write_table(pa.Table.from_pylist(table, schema=COLUMNS), clean / "manifest.parquet")
    report = {"schema_version": 1, "tool": p[1], "files": 99, "by_status": {"kept": 1, "duplicate": 0, "quarantined": 0},
              "by_reason": {}, "by_kind": {}, "by_encoding": {}, "kept_by_label": {p[0]: 1},
              "settings": {"input": p[0]}, "input": {"path": p[0], "from_clean_dir": p[2]}, "timings": {},
              "label_conflicts": [{"files": [table[0]["source"], p[3]], "labels": {q: 1 for q in p}, "policy": p[4],
                                   "action": p[0], "kept": None}]}
    (clean / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return clean


def _hostile_run(root):
    run = build_run(root, drift_host=PAYLOADS[0])
    pq.write_table(pa.table({"rank": [1, 2], "key": ["k0", "k1"], "source": PAYLOADS[:2], "split": ["train", "val"],
                             "given": PAYLOADS[2:4], "suggested": PAYLOADS[3:5], "score": [0.5, 0.25]}),
                   run / "label_issues.parquet")
    return run


def _body(page: str) -> str:
    head, sep, body = page.partition("</head>")
    assert sep and head.count("<meta") == 3 and head.count("<style>") == 1
    return body


def test_markup_in_every_field_stays_text(tmp_path):
    from pipeline.report.stage import build

    folders = build_all(tmp_path / "real")
    shards = tmp_path / "shards"
    shutil.copytree(folders["shards"], shards)
    index = json.loads((shards / "index.json").read_text(encoding="utf-8"))
    index["classes"] = sorted(PAYLOADS[:2])
    index["counts"]["train"]["per_class"] = {c: 1 for c in index["classes"]}
    (shards / "index.json").write_text(json.dumps(index), encoding="utf-8")
    page = build([_hostile_clean(tmp_path / "clean"), shards, _hostile_run(tmp_path / "run")])
    body = _body(page)
    found = re.search(r"<(meta|style|script|svg onload|img src=x).{0,80}", body, re.IGNORECASE)
    assert found is None, found
    assert body.count("<h1>") == 1 and body.count("</section>") == 3  # no element closed early
    assert "evil.example" in body  # there, as text
    assert "breaks" not in body  # every hostile value above is a valid string: escaping alone keeps it text


def test_the_policy_allows_only_the_pages_own_style_sheet():
    from pipeline.report import render

    policy = dict(d.strip().split(" ", 1) for d in render.CSP.split(";"))
    assert policy["default-src"] == "'none'" and policy["img-src"] == "data:"
    assert policy["style-src"].startswith("'sha256-") and "unsafe" not in render.CSP
    assert policy["base-uri"] == "'none'" and policy["form-action"] == "'none'"


def test_numbers_from_the_data_are_formatted_or_escaped():
    from pipeline.report import safe

    assert safe.num(1234567) == "1,234,567" and safe.num(0.98765, ".2f") == "0.99"
    assert safe.num('<meta http-equiv="refresh">') == "&lt;meta http-equiv=&quot;refresh&quot;&gt;"
    assert safe.num(True) == "True" and safe.num(None) == ""


def test_check_verdicts_are_escaped_too(tmp_path):
    from pipeline.report.render import page

    html = page([], check={"ok": False, "summary": {"passed": "<b>1</b>"}, "exit_code": "<i>",
                           "folders": [{"kind": "<u>", "path": "<s>", "checks": [
                               {"name": "<x>", "status": "fail", "severity": "error", "message": "<y>", "examples": ["<z>"]},
                               {"name": "v", "status": "<w>", "severity": "<v>"}]}]})
    assert not re.search(r"<(b|i|u|s|v|w|x|y|z)>", _body(html))
