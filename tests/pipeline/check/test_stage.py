"""`pipe check` as a command: folder recognition, exit codes, the table, --json and --junit."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from pipeline.check.registry import names as check_names
from pipeline.core import schemas
from tests.check_fixtures import copy_dir, kept_output, policy_file
from tests.conftest import pipe_env
from tests.factories import image_bytes, noise_rgb, photo


@pytest.fixture
def bad(good, tmp_path):
    """The good clean dir with one image of the wrong size: one error-severity violation."""
    d = copy_dir(good[1], tmp_path / "bad")
    kept_output(d).write_bytes(image_bytes(noise_rgb(40, 40, seed=1)))
    return d


def one_line_error(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    return lines[0]


def test_pass_is_exit_0_with_a_row_per_check(cli, good):
    r = cli("check", good[1], "--policy", good[2])
    assert r.exit_code == 0, r.stdout + r.stderr
    for name in ("schema", "quarantined_fraction", "image_size", "text_encoding", "decodes"):
        assert name in r.stdout
    assert "PASSED" in r.stdout


def test_violation_is_exit_1_and_named(cli, good, bad):
    r = cli("check", bad, "--policy", good[2])
    assert r.exit_code == 1
    assert "FAIL" in r.stdout and "40x40" in r.stdout


def test_without_policy_the_defaults_apply(cli, good):
    r = cli("check", good[1], "--json")  # default min_samples_per_class is 10; the good set has 6
    doc = json.loads(r.stdout)
    assert r.exit_code == 1
    assert [c["name"] for c in doc["folders"][0]["checks"] if c["status"] == "fail"] == ["min_samples_per_class"]


@pytest.mark.parametrize("make, expect", [
    (lambda t: t / "nope", "folder not found"),
    (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "is not a folder"),
    (lambda t: (t / "empty").mkdir() or t / "empty", "neither a clean dir"),
    (lambda t: (t / "tars").mkdir() or (t / "tars" / "train-000000.tar").write_bytes(b"") or t / "tars", "no index.json"),
])
def test_not_a_dataset_folder_is_usage_error(cli, tmp_path, make, expect):
    r = cli("check", make(tmp_path))
    assert r.exit_code == 2
    assert expect in one_line_error(r)


def test_unfinished_clean_dir_is_usage_error(cli, good, tmp_path):
    d = copy_dir(good[1], tmp_path / "c")
    (d / "manifest.parquet").unlink()
    r = cli("check", d)
    assert r.exit_code == 2 and "unfinished pipe clean" in one_line_error(r)


def test_bad_policy_is_usage_error_before_any_work(cli, good, tmp_path):
    p = policy_file(tmp_path, "max_quarantined_fraction = 0.1\nmin_sample_per_class = 3\n")
    r = cli("check", good[1], "--policy", p)
    assert r.exit_code == 2
    assert "did you mean 'min_samples_per_class'" in one_line_error(r)


def test_a_bad_folder_among_several_is_usage_error(cli, good, tmp_path):
    r = cli("check", good[1], tmp_path / "missing", "--policy", good[2])
    assert r.exit_code == 2 and "folder not found" in one_line_error(r)


def test_json_matches_its_schema_and_the_exit_code(cli, good, bad):
    r = cli("check", good[1], bad, "--policy", good[2], "--json")
    doc = json.loads(r.stdout)
    assert schemas.errors(doc, "check_report") == []
    assert r.exit_code == 1 and doc["exit_code"] == 1 and doc["ok"] is False
    good_checks, bad_checks = (f["checks"] for f in doc["folders"])
    assert all(c["status"] != "fail" for c in good_checks)
    assert [c["name"] for c in bad_checks if c["status"] == "fail"] == ["image_size"]
    assert doc["summary"]["errors"] == 1
    assert {c["name"] for c in good_checks} <= set(check_names())


def test_junit_one_testcase_per_check_read_by_a_junit_parser(cli, good, bad, tmp_path):
    from junitparser import Failure, JUnitXml, Skipped

    out = tmp_path / "reports" / "data-quality.xml"
    r = cli("check", good[1], bad, "--policy", good[2], "--junit", out)
    assert r.exit_code == 1
    xml = JUnitXml.fromfile(str(out))
    suites = list(xml)
    assert len(suites) == 2
    n_checks = len(list(suites[0]))
    assert n_checks == len(list(suites[1])) >= 13
    assert xml.tests == 2 * n_checks and xml.failures == 1 and xml.errors == 0
    failed = [(c.name, type(res).__name__) for s in suites for c in s for res in c.result if isinstance(res, Failure)]
    assert failed == [("image_size", "Failure")]
    skipped = {c.name for s in suites for c in s for res in c.result if isinstance(res, Skipped)}
    assert skipped == {"decodes"}  # not --deep


def test_junit_warning_is_not_a_failure(cli, good, tmp_path):
    out = tmp_path / "j.xml"
    policy = policy_file(tmp_path, "min_samples_per_class = 4\nmax_class_imbalance = 3\n[severity]\nimage_size = 'warning'\n")
    d = copy_dir(good[1], tmp_path / "c")
    kept_output(d).write_bytes(image_bytes(noise_rgb(40, 40, seed=1)))
    r = cli("check", d, "--policy", policy, "--junit", out)
    assert r.exit_code == 0 and "warn" in r.stdout
    root = ET.parse(out).getroot()
    assert root.get("failures") == "0"
    case = root.find(".//testcase[@name='image_size']")
    assert case.find("failure") is None and "WARNING" in case.find("system-out").text


def test_junit_stays_valid_xml_with_control_characters_in_file_names(cli, good, tmp_path):
    raw = copy_dir(good[0], tmp_path / "raw")
    photo(raw / "dogs" / "bell\x07\x1b[31m.jpg", seed=4)  # real file names can hold these
    out = tmp_path / "j.xml"
    r = cli("check", good[1], "--policy", good[2], "--input", raw, "--junit", out)
    assert r.exit_code == 1
    case = ET.parse(out).getroot().find(".//testcase[@name='manifest_matches_input']")
    assert "bell\\x07\\x1b[31m.jpg" in case.find("failure").get("message")


@pytest.fixture
def shards(good, tmp_path):
    from tests.check_fixtures import run_shard

    return run_shard(good[1], tmp_path / "shards")


@pytest.mark.parametrize("inside", ["index.json", "new.xml", "sub/dir/j.xml"])
def test_junit_inside_a_checked_shard_dir_is_refused_and_nothing_written(cli, good, shards, inside):
    before = {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()}
    r = cli("check", shards, "--policy", good[2], "--junit", shards / inside)
    assert r.exit_code == 2
    line = one_line_error(r)
    assert "--junit" in line and "inside" in line
    assert {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("inside", ["manifest.parquet", "report.json", "data/dogs/j.xml"])
def test_junit_inside_a_checked_clean_dir_is_refused_and_nothing_written(cli, good, tmp_path, inside):
    d = copy_dir(good[1], tmp_path / "clean")
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    r = cli("check", good[1], d, "--policy", good[2], "--junit", d / inside)  # the second folder holds it
    assert r.exit_code == 2 and "inside" in one_line_error(r)
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def test_junit_through_a_relative_or_linked_path_into_a_checked_dir_is_refused(cli, good, tmp_path, monkeypatch):
    d = copy_dir(good[1], tmp_path / "clean")
    (tmp_path / "link").symlink_to(d)
    manifest = (d / "manifest.parquet").read_bytes()
    monkeypatch.chdir(tmp_path)
    for junit in ("clean/../clean/manifest.parquet", "link/manifest.parquet"):
        r = cli("check", "clean", "--policy", good[2], "--junit", junit)
        assert r.exit_code == 2 and "inside" in one_line_error(r), junit
    assert (d / "manifest.parquet").read_bytes() == manifest


def test_junit_naming_a_folder_is_refused(cli, good, tmp_path):
    r = cli("check", good[1], "--policy", good[2], "--junit", tmp_path)
    assert r.exit_code == 2 and "is a folder" in one_line_error(r)
    assert list(tmp_path.iterdir()) == []


def test_junit_beside_the_checked_dir_and_in_a_new_folder_is_written(cli, good, tmp_path):
    out = tmp_path / "new" / "deeper" / "j.xml"  # missing folders are made
    r = cli("check", good[1], "--policy", good[2], "--junit", out)
    assert r.exit_code == 0, r.output
    assert ET.parse(out).getroot().tag == "testsuites"


def test_junit_path_that_cannot_be_written_is_one_line_exit_2(cli, good, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    r = cli("check", good[1], "--policy", good[2], "--junit", blocker / "j.xml")  # its parent is a file
    assert r.exit_code == 2
    assert "cannot write the JUnit file" in one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_check_never_imports_torch(good):
    code = ("import sys; from pipeline.cli.app import app; from typer.testing import CliRunner; "
            f"r = CliRunner().invoke(app, ['check', {str(good[1])!r}, '--deep', '--json']); "
            "assert r.exit_code in (0, 1), r.output; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


def test_input_that_is_not_a_folder_is_usage_error(cli, good, tmp_path):
    r = cli("check", good[1], "--input", tmp_path / "nope")
    assert r.exit_code == 2 and "--input" in one_line_error(r)


def test_config_file_check_table_sets_the_policy(cli, good, tmp_path):
    policy = policy_file(tmp_path, "min_samples_per_class = 4\nmax_class_imbalance = 3\nimage_size = 128\n")
    cfg = tmp_path / "pipe.toml"
    cfg.write_text(f'[check]\npolicy = "{policy}"\n')
    r = cli("check", good[1], "--config", cfg, "--json")
    assert [c["name"] for c in json.loads(r.stdout)["folders"][0]["checks"] if c["status"] == "fail"] == ["image_size"]
    assert cli("check", good[1], "--config", cfg, "--policy", good[2]).exit_code == 0  # the flag wins
    cfg.write_text("[check]\npolicy_file = 'x'\n")
    assert cli("check", good[1], "--config", cfg).exit_code == 2


def test_check_config_keys_match_the_config_schema():
    import dataclasses

    from pipeline.check.stage import CheckConfig

    fields = {f.name for f in dataclasses.fields(CheckConfig)} - {"dirs"}
    assert set(schemas.load_schema("config")["properties"]["check"]["properties"]) == fields
