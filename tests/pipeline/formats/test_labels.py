"""Class names: one spelling per name (NFC) wherever labels enter pipe, and names that differ only
by case or character form said by pipe clean, pipe shard and pipe check. The attack is built:
two class folders "café" (NFC and NFD: they look the same), "Cat" beside "cat", a labels file
with an NFD label, and a manifest whose label column another tool wrote in NFD."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.formats.labels import label_name, similar_names, similar_names_warning
from tests.conftest import pipe_env
from tests.factories import photo, write

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def test_label_names_are_nfc_and_similar_names_are_grouped():
    assert NFC != NFD and label_name(NFD) == NFC and label_name("cat") == "cat"
    assert similar_names(["cat", "Cat", "dog", NFC, NFD, "ｃａｔ", None, ""]) == sorted([sorted([NFC, NFD]), ["Cat", "cat", "ｃａｔ"]])
    assert similar_names(["cat", "dog"]) == [] and similar_names_warning(["cat", "dog"]) is None
    assert "'Cat' and 'cat'" in similar_names_warning(["cat", "Cat"])


def _pipe(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          env=pipe_env(), timeout=600)


def _rows(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.mark.slow
def test_class_folders_that_look_alike_are_one_class_and_case_twins_are_said(tmp_path):
    raw = tmp_path / "raw"
    for i in range(3):
        photo(raw / NFC / f"a{i}.jpg", seed=i)
        photo(raw / NFD / f"b{i}.jpg", seed=10 + i)
        photo(raw / "cat" / f"c{i}.jpg", seed=20 + i)
        photo(raw / "Cat" / f"d{i}.jpg", seed=30 + i)
    clean = _pipe("clean", raw, "-o", tmp_path / "clean", "--workers", "1")
    assert clean.returncode == 0, clean.stderr
    assert "warning: labels that differ only by case or character form are separate classes: 'Cat' and 'cat'" in clean.stderr
    rows = _rows(tmp_path / "clean" / "manifest.parquet")
    assert {r["label"] for r in rows} == {NFC, "cat", "Cat"}
    assert {r["source"].split("/")[0] for r in rows} == {NFC, NFD, "cat", "Cat"}  # the files' own paths stay
    report = json.loads((tmp_path / "clean" / "report.json").read_text(encoding="utf-8"))
    assert report["kept_by_label"] == {"Cat": 3, "cat": 3, NFC: 6} and len(report["warnings"]) == 1

    shard = _pipe("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--workers", "1")
    assert shard.returncode == 0, shard.stderr
    assert json.loads((tmp_path / "shards" / "index.json").read_text(encoding="utf-8"))["classes"] == sorted(["Cat", "cat", NFC])
    assert "'Cat' and 'cat'" in shard.stderr

    check = _pipe("check", tmp_path / "clean", tmp_path / "shards", "--json")
    assert check.returncode in (0, 1), check.stderr
    for folder in json.loads(check.stdout)["folders"]:
        found = {c["name"]: c for c in folder["checks"]}["distinct_labels"]
        assert found["status"] == "fail" and found["severity"] == "warning", found
        assert "'Cat' and 'cat'" in found["message"]


@pytest.mark.slow
def test_a_labels_file_and_a_manifest_in_nfd_give_one_class(tmp_path):
    raw = tmp_path / "raw"
    for i in range(4):
        photo(raw / f"{i}.jpg", seed=i)
    write(tmp_path / "labels.csv", "path,label\n0.jpg,café\n1.jpg,café\n2.jpg,dog\n3.jpg,dog\n"
          .replace("café", NFD, 1).replace("café", NFC).encode("utf-8"))
    clean = _pipe("clean", raw, "-o", tmp_path / "clean", "--labels", tmp_path / "labels.csv", "--workers", "1")
    assert clean.returncode == 0, clean.stderr
    assert {r["label"] for r in _rows(tmp_path / "clean" / "manifest.parquet")} == {NFC, "dog"}

    # another tool's manifest (or an older pipe's), its labels in NFD: pipe shard makes one class of them
    table = pq.read_table(tmp_path / "clean" / "manifest.parquet")
    labels = [NFD if (lab == NFC and i % 2) else lab for i, lab in enumerate(table.column("label").to_pylist())]
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.string()))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    (tmp_path / "clean" / "manifest.parquet").write_bytes(buf.getvalue())
    check = _pipe("check", tmp_path / "clean", "--json")
    found = {c["name"]: c for c in json.loads(check.stdout)["folders"][0]["checks"]}["distinct_labels"]
    assert found["status"] == "fail" and NFD in found["message"] and NFC in found["message"]
    shard = _pipe("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--workers", "1")
    assert shard.returncode == 0, shard.stderr
    assert json.loads((tmp_path / "shards" / "index.json").read_text(encoding="utf-8"))["classes"] == [NFC, "dog"]
