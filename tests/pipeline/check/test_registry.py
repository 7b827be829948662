"""The checks of pipe check, registered once: the stage runs every registered check of a folder's
kind in the order written, the policy takes a [severity] key for each and no other, and the
policy's schema documents exactly the registry."""

from __future__ import annotations

import pytest

from pipeline.check import policy, registry
from pipeline.core import schemas
from pipeline.core.errors import UsageError
from tests.check_fixtures import check, copy_dir, policy_file, run_shard


@pytest.fixture(scope="module")
def shards(good, tmp_path_factory):
    return run_shard(good[1], tmp_path_factory.mktemp("registry") / "shards")


@pytest.mark.parametrize("kind", list(registry.KINDS))
def test_every_registered_check_runs_in_the_order_written(good, shards, kind):
    folder = good[1] if kind == "clean" else shards
    report = check(folder, good[2])
    assert [r.name for r in report.results] == registry.names_of(kind)
    assert all(r.status in ("pass", "skip") for r in report.results), [r.message for r in report.results if r.status == "fail"]


def test_a_check_that_crashes_fails_itself_under_its_registered_name(good, tmp_path, monkeypatch):
    target = next(c for c in registry.checks("clean") if c.name == "duplicates")

    def broken(d, p):
        raise RuntimeError("odd data")

    monkeypatch.setitem(registry._REGISTERED["clean"], "duplicates",
                        registry.Check(target.kind, target.name, target.severity, target.description, broken))
    report = check(copy_dir(good[1], tmp_path / "c"), good[2])
    (r,) = [r for r in report.results if r.name == "duplicates"]
    assert r.status == "fail" and "the check crashed: RuntimeError: odd data" in r.message


def test_the_policy_takes_a_severity_for_every_check_and_no_other(tmp_path):
    names = registry.names()
    table = "".join(f'{n} = "warning"\n' for n in names)
    p = policy.load(policy_file(tmp_path, f"[severity]\n{table}"))
    assert p.severity == dict.fromkeys(names, "warning")
    assert policy.Policy().severity == registry.default_severity() and set(policy.Policy().severity) == set(names)
    with pytest.raises(UsageError, match="unknown \\[severity\\] key 'no_such_check'"):
        policy.load(policy_file(tmp_path, '[severity]\nno_such_check = "warning"\n'))


def test_a_name_both_kinds_have_is_one_check_with_one_default():
    shared = set(registry.names_of("clean")) & set(registry.names_of("shard"))
    assert {"schema", "keys_unique", "class_imbalance"} <= shared
    assert registry.default_severity()["class_imbalance"] == "warning"
    assert registry.names().count("schema") == 1


def test_the_policy_schema_documents_the_registry():
    """schemas/policy.schema.json's [severity] table is `registry.severity_schema()`: rewrite it from
    there when a check is added or reworded."""
    assert schemas.load_schema("policy")["properties"]["severity"] == registry.severity_schema()


def test_a_check_is_declared_with_a_kind_a_severity_and_a_description():
    with pytest.raises(ValueError, match="no folder kind"):
        registry.check("run")
    with pytest.raises(ValueError, match="severity"):
        registry.check("clean", severity="fatal")

    def check_undocumented(d, p):
        return None

    with pytest.raises(ValueError, match="docstring"):
        registry.check("clean")(check_undocumented)
