"""The one road to storage: a folder argument's scheme is looked up in one table
(`pipeline.storage.SCHEMES`), an unknown one is one clear line, and no module outside
pipeline/storage/ knows which object store it is on (nor imports a storage client or Ray)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.core.errors import UsageError
from pipeline.storage import SCHEMES, location, open_folder

REPO = Path(__file__).resolve().parents[3]


def test_a_url_of_a_known_scheme_stays_text_and_anything_else_is_a_path():
    assert location("s3://bucket/prefix") == "s3://bucket/prefix"
    assert location("some/folder") == Path("some/folder")
    assert location(Path("x")) == Path("x")
    assert open_folder(Path("x")).local_path == Path("x")
    assert set(SCHEMES) == {"s3"}


@pytest.mark.parametrize("url", ["gs://bucket/data", "azure://c/d", "HTTP://host/x?sig=secret"])
def test_an_unknown_scheme_is_one_line_naming_it(url):
    for call in (location, open_folder):
        with pytest.raises(UsageError) as e:
            call(url)
        message = str(e.value)
        scheme = url.split("://")[0].lower()
        assert f"{scheme}://" in message and "\n" not in message and "secret" not in message
        assert "s3://" in message  # what it knows instead


def test_an_unknown_scheme_on_the_command_line_is_exit_2_in_one_line(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    for args in (["clean", "gs://b/raw", "-o", tmp_path / "out"], ["clean", tmp_path / "raw", "-o", "gs://b/out"],
                 ["check", "gs://b/clean"]):
        p = pipe_proc(*args)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "gs://" in lines[0], p.stderr


def _modules(*roots: str):
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


def test_no_module_outside_pipeline_storage_spells_an_object_store():
    """Help texts included: they take their example from `pipeline.storage.EXAMPLE_URL`."""
    words = re.compile(r"\b(?:s3|boto3|botocore|s3fs|fsspec|gcs|gs|azure|abfs)\b|[a-z0-9]+://", re.IGNORECASE)
    found = []
    for rel, text in _modules("pipeline", "train"):
        if rel.startswith("pipeline/storage/"):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in words.finditer(line):
                if m.group(0).lower() not in ("http://", "https://"):  # (links in docstrings, if any)
                    found.append(f"{rel}:{n}: {m.group(0)}")
    assert found == []


def _imports(text: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_storage_imports_a_storage_client_and_only_the_ray_executor_imports_ray():
    clients = {"boto3", "botocore", "s3fs", "fsspec", "aiobotocore"}
    wrong = []
    for rel, text in _modules("pipeline", "train"):
        names = _imports(text)
        if names & clients and not rel.startswith("pipeline/storage/"):
            wrong.append(f"{rel}: {sorted(names & clients)}")
        if "ray" in names and rel != "pipeline/executors/ray.py":
            wrong.append(f"{rel}: ray")
    assert wrong == []


def test_stages_never_ask_which_executor_or_storage_they_run_on():
    """No executor's name and no storage's kind in a stage: those are the executor's and the
    folder's own (`pipeline.executors`, `pipeline.storage.Folder`)."""
    asks = re.compile(r"""executor\s*[!=]=|["']ray["']|is_remote|pipeline\.executors\.(?:ray|local)\b""")
    found = [f"{rel}:{n}" for rel, text in _modules("pipeline/clean", "pipeline/shard", "pipeline/check", "pipeline/report")
             for n, line in enumerate(text.splitlines(), 1) if asks.search(line)]
    assert found == []
