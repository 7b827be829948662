"""schemas/config.schema.json is generated from the declared settings, and committed: it must be
what the declarations generate now."""

from pipeline.cli import config_schema
from pipeline.core import schemas


def test_the_committed_config_schema_is_what_the_declarations_generate():
    committed = (schemas.SCHEMA_DIR / "config.schema.json").read_text(encoding="utf-8")
    assert committed == config_schema.text(), (
        "schemas/config.schema.json differs from the declared settings: run python -m pipeline.cli.config_schema --write")


def test_the_generated_schema_is_a_valid_schema_with_a_table_per_command():
    import jsonschema

    doc = config_schema.document()
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["additionalProperties"] is False
    assert list(doc["properties"]) == ["clean", "shard", "check", "report", "train", "eval", "labels", "export", "doctor"]
    for table in doc["properties"].values():
        assert table["additionalProperties"] is False
        assert all(p.get("description") for p in table["properties"].values())
