"""schemas/README.md documents every schema in the folder (another tool's only guide)."""

from pipeline.core import schemas


def test_readme_names_every_schema():
    text = (schemas.SCHEMA_DIR / "README.md").read_text(encoding="utf-8")
    for path in schemas.SCHEMA_DIR.glob("*.schema.json"):
        assert f"`{path.name}`" in text, path.name
        assert f"## {path.name.removesuffix('.schema.json')}" in text, path.name


def test_every_property_of_our_schemas_is_described():
    def walk(node, where):
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                assert "description" in sub or "$ref" in sub or name in ("schema_version",), f"{where}/{name}"
                walk(sub, f"{where}/{name}")
            for name, sub in node.get("$defs", {}).items():
                walk(sub, f"{where}/$defs/{name}")
    for name in ("policy", "check_report", "doctor_report", "config", "export"):
        walk(schemas.load_schema(name), name)
