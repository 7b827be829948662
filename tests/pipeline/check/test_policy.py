"""The quality policy: defaults documented in the schema, typos and bad values are usage errors."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.check import policy, registry
from pipeline.core import schemas
from pipeline.core.errors import UsageError


def write(tmp_path, text):
    p = tmp_path / "policy.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_no_file_means_the_defaults():
    assert policy.load(None) == policy.Policy()


def test_schema_documents_every_key_and_its_default():
    props = schemas.load_schema("policy")["properties"]
    fields = {f.name: f for f in dataclasses.fields(policy.Policy)}
    assert set(props) == set(fields)
    for name, f in fields.items():
        if name == "severity":
            continue
        assert props[name]["description"]
        if f.default is None:
            assert "default" not in props[name], name  # unset: documented in words ("Default: ...")
            assert "Default:" in props[name]["description"], name
        else:
            assert props[name]["default"] == f.default, name


def test_severity_table_names_every_check_with_its_default():
    sev = schemas.load_schema("policy")["properties"]["severity"]["properties"]
    assert list(sev) == list(registry.names())
    assert {k: v["default"] for k, v in sev.items()} == registry.default_severity()


def test_values_and_severities_are_read(tmp_path):
    p = policy.load(write(tmp_path, 'min_samples_per_class = 50\nclasses = ["a", "b"]\n[severity]\nleakage = "warning"\n'))
    assert p.min_samples_per_class == 50 and p.classes == ("a", "b")
    assert p.severity_of("leakage") == "warning"
    assert p.severity_of("schema") == "error" and p.severity_of("class_imbalance") == "warning"
    assert p.max_quarantined_fraction == policy.Policy().max_quarantined_fraction


@pytest.mark.parametrize("text, expect", [
    ("max_quarantine_fraction = 0.1\n", "unknown key 'max_quarantine_fraction' (did you mean 'max_quarantined_fraction'?)"),
    ("[severity]\nleakge = 'warning'\n", "unknown [severity] key 'leakge' (did you mean 'leakage'?)"),
    ("max_duplicate_fraction = 'ten percent'\n", "max_duplicate_fraction"),
    ("max_quarantined_fraction = 1.5\n", "max_quarantined_fraction"),
    ("min_samples_per_class = 2.5\n", "min_samples_per_class"),
    ("[severity]\nschema = 'fatal'\n", "severity/schema"),
    ("image_size = [", "not valid TOML"),
])
def test_bad_policies_are_usage_errors(tmp_path, text, expect):
    with pytest.raises(UsageError) as e:
        policy.load(write(tmp_path, text))
    assert expect in str(e.value)


def test_missing_policy_file(tmp_path):
    with pytest.raises(UsageError, match="policy file not found"):
        policy.load(tmp_path / "nope.toml")


def test_check_names_are_the_checks_that_exist():
    assert set(registry.names()) == set(registry.names_of("clean")) | set(registry.names_of("shard"))
