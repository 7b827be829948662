"""`pipe report` on a shard dir someone else wrote (issue 24 item 11): index.json is checked
against its schema before any of it is shown."""

from __future__ import annotations

import json

import pytest

from tests.report_fixtures import build_all


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("shard"))["shards"]


@pytest.mark.parametrize("attack", [
    lambda ix: ix["counts"]["train"].update(samples="many"),  # a string count (an internal error before)
    lambda ix: ix["counts"].update({f"split{i}": ix["counts"]["train"] for i in range(10_000)}),  # 10,000 splits
    lambda ix: ix["shards"][0].update(name="../../etc/passwd"),
    lambda ix: ix.update(classes=["<style>*{display:none}</style>", 7]),
    lambda ix: ix["counts"]["val"]["per_class"].update(cat=-1),
], ids=["string-count", "many-splits", "name-leaves", "odd-classes", "negative-count"])
def test_an_index_that_breaks_its_schema_is_named_not_drawn(shards, tmp_path, attack, cli):
    import shutil

    bad = tmp_path / "shards"
    shutil.copytree(shards, bad)
    index = json.loads((bad / "index.json").read_text(encoding="utf-8"))
    attack(index)
    (bad / "index.json").write_text(json.dumps(index), encoding="utf-8")
    r = cli("report", bad, "-o", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "index.json breaks schemas/index.schema.json, so none of it is shown" in page
    assert "Classes (" not in page and "data:image" not in page and "<style>*" not in page
    assert len(page) < 100_000


def test_the_index_pipe_shard_wrote_is_shown(shards):
    from pipeline.report.stage import build

    page = build([shards])
    assert "breaks" not in page and "Classes (2)" in page and "data:image/jpeg" in page


def test_an_index_that_links_out_of_the_folder_is_not_read(shards, tmp_path):
    from pipeline.report.stage import build

    bad = tmp_path / "shards"
    bad.mkdir()
    (bad / "index.json").symlink_to(shards / "index.json")
    page = build([bad])
    assert "index.json is not readable JSON: index.json: not a file inside" in page
    assert "Classes (" not in page
