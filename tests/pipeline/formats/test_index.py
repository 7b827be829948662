"""index.json has one reader: `load` (a usable index) and `parse` (read, not judged), from a local
path or any storage folder, never more than MAX_BYTES; no other module opens the file."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pipeline.core.errors import UsageError
from pipeline.formats import index as shard_index
from pipeline.storage import Folder, TooLarge

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from tests.check_fixtures import run_shard
    from tests.clean_dirs import make_clean_dir, simple_specs

    tmp = tmp_path_factory.mktemp("index")
    return run_shard(make_clean_dir(tmp / "clean", simple_specs(12, classes=2, text_every=3)), tmp / "shards")


class MemoryFolder(Folder):
    """Object storage as far as the index reader sees it: files by name, a size cap on reads."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.url, self.local_path = files, "mem://bucket/shards", None

    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        if rel not in self.files:
            raise FileNotFoundError(2, "no such object", f"{self.url}/{rel}")
        if max_bytes is not None and len(self.files[rel]) > max_bytes:
            raise TooLarge(rel, len(self.files[rel]))
        return self.files[rel]

    def exists(self, rel: str) -> bool:
        return rel in self.files

    def list(self):
        raise NotImplementedError

    open = upload = read_range = write = write_if_absent = move = delete = child = list


def test_one_reader_for_a_path_and_a_folder(shards):
    raw = (shards / "index.json").read_bytes()
    doc, got = shard_index.load_bytes(shards)
    assert got == raw and doc == json.loads(raw)
    assert shard_index.load(str(shards)) == doc
    assert shard_index.load_bytes(MemoryFolder({"index.json": raw})) == (doc, raw)
    assert shard_index.parse(MemoryFolder({"index.json": raw})) == (doc, None)
    assert shard_index.exists(shards) and not shard_index.exists(shards.parent)
    assert shard_index.exists(MemoryFolder({"index.json": raw})) and not shard_index.exists(MemoryFolder({}))


def test_a_missing_index_says_where(tmp_path):
    with pytest.raises(UsageError, match=r"index.json not found \(pipe shard writes it last"):
        shard_index.load(tmp_path)
    with pytest.raises(UsageError, match=r"^mem://bucket/shards/index.json not found \(pipe shard writes it last"):
        shard_index.load(MemoryFolder({}))
    doc, problem = shard_index.parse(tmp_path)
    assert doc is None and "No such file" in str(problem)


@pytest.mark.parametrize("where", ["path", "folder"])
def test_a_huge_index_is_refused_unread(tmp_path, monkeypatch, shards, where):
    raw = (shards / "index.json").read_bytes()
    monkeypatch.setattr(shard_index, "MAX_BYTES", len(raw) - 1)
    source = shards if where == "path" else MemoryFolder({"index.json": raw})
    with pytest.raises(UsageError, match=f"larger than {len(raw) - 1} bytes: not an index pipe shard wrote"):
        shard_index.load(source)
    assert shard_index.parse(source) == (None, f"larger than {len(raw) - 1} bytes: not an index pipe shard wrote")


@pytest.mark.parametrize("text, problem", [("[" * 100_000, "nested too deeply to parse"), ("{not json", "Expecting property name")])
def test_an_index_that_is_not_json(tmp_path, text, problem):
    (tmp_path / "index.json").write_text(text)
    doc, why = shard_index.parse(tmp_path)
    assert doc is None and problem in str(why)
    with pytest.raises(UsageError, match=f"index.json is not valid JSON: {problem}"):
        shard_index.load(tmp_path)


def test_an_index_off_its_schema_is_not_loaded_but_parsed(tmp_path):
    (tmp_path / "index.json").write_text('{"schema_version": 1}')
    assert shard_index.parse(tmp_path) == ({"schema_version": 1}, None)
    with pytest.raises(UsageError, match="index.json"):
        shard_index.load(tmp_path)


# Modules that write index.json (pipe shard: the file is its commit); everything else reads
# it only through pipeline.formats.index.
WRITERS = {"pipeline/shard/stage.py"}


def test_no_module_outside_formats_opens_index_json():
    """No "index.json" file name in code outside pipeline/formats (messages and docs say it in
    longer strings), and INDEX_NAME only where pipe shard writes the file."""
    found = []
    for path in sorted([*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("train/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("pipeline/formats/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "index.json":
                found.append(f"{rel}:{node.lineno}: 'index.json'")
            named = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if named == "INDEX_NAME" and rel not in WRITERS:
                found.append(f"{rel}:{node.lineno}: INDEX_NAME")
    assert not found, found


def test_a_clean_folder_where_shards_belong_says_run_pipe_shard(tmp_path):
    """The commonest first mistake: pipe clean's output handed to a command that reads shards. Its
    marker (or, without one, its manifest) says what it is, and the line says what to run."""
    marked = tmp_path / "clean"
    (marked / ".pipe").mkdir(parents=True)
    (marked / ".pipe" / "state.json").write_text(json.dumps({"tool": "pipe clean"}))
    with pytest.raises(UsageError) as e:
        shard_index.load(marked)
    assert str(e.value) == (f"{marked}/index.json not found: {marked} is a clean folder (pipe clean's output), not "
                            f"shards: run pipe shard {marked} -o SHARD_DIR, then pass SHARD_DIR")
    with pytest.raises(UsageError, match=r"^mem://bucket/shards/index.json not found: mem://bucket/shards is a clean "
                                         r"folder \(pipe clean's output\), not shards: run pipe shard mem://bucket/shards"):
        shard_index.load(MemoryFolder({"manifest.parquet": b"PAR1"}))
    shard_marked = MemoryFolder({".pipe/state.json": json.dumps({"tool": "pipe shard"}).encode()})
    with pytest.raises(UsageError, match=r"index.json not found \(pipe shard writes it last: was the run interrupted"):
        shard_index.load(shard_marked)
