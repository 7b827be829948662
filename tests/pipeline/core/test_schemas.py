"""The schemas in schemas/ are valid and agree with the code that writes the files."""

import json

import pytest

from pipeline.core import schemas
from pipeline.formats.manifest import COLUMNS
from pipeline.formats.vocabulary import Kind, Reason, Status


@pytest.mark.parametrize("path", sorted(schemas.SCHEMA_DIR.glob("*.schema.json")), ids=lambda p: p.name)
def test_schema_is_valid_json_schema(path):
    import jsonschema

    doc = json.loads(path.read_text())
    jsonschema.validators.validator_for(doc).check_schema(doc)


def test_manifest_schema_matches_columns():
    schema = schemas.load_schema("manifest_row")
    assert list(schema["properties"]) == COLUMNS.names
    assert set(schema["required"]) == set(COLUMNS.names)


def test_reason_vocabulary_is_documented():
    schema = schemas.load_schema("manifest_row")
    enum = schema["properties"]["reason"]["oneOf"][1]["enum"]
    assert set(enum) == {r.value for r in Reason}
    assert schema["x-reasons"] == {r.value: r.description for r in Reason}


def test_status_and_kind_vocabulary_is_the_schemas():
    schema = schemas.load_schema("manifest_row")
    assert schema["properties"]["status"]["enum"] == [s.value for s in Status]
    assert schema["properties"]["kind"]["enum"] == [k.value for k in Kind]


def test_clean_config_keys_match_schema():
    import dataclasses

    from pipeline.clean.stage import CleanConfig

    fields = {f.name for f in dataclasses.fields(CleanConfig)} - {"input", "output"}
    assert set(schemas.load_schema("config")["properties"]["clean"]["properties"]) == fields
