"""The shard sample format: one rule cuts a member name into key and extension, webdataset's, and
every reader of shards (the streaming reader, pipe check, pipe report, pipe labels) cuts names by
it; pipe shard's array layout puts each payload where the member order says."""

from __future__ import annotations

import ast
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.formats import sample, tarstream

ROOT = Path(__file__).resolve().parents[3]

# -- the rule ---------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab._/-\n ", min_size=0, max_size=14))
def test_split_name_is_webdatasets_rule(name):
    from webdataset.tariterators import base_plus_ext

    key, ext = base_plus_ext(name)
    if key is None:
        with pytest.raises(ValueError):
            sample.split_name(name)
    else:
        assert sample.split_name(name) == (key, ext)
        assert sample.member_name(key, ext) == name


@pytest.mark.parametrize("name, parts", [
    ("k.jpg", ("k", "jpg")), ("k.seg.jpg", ("k", "seg.jpg")), ("a.b/k.cls", ("a.b/k", "cls")),
    ("../../k.txt", ("../../k", "txt")), ("k.", ("k", "")), ("dir/.jpg", ("dir/", "jpg")),  # webdataset: key "dir/"
])
def test_split_name_examples(name, parts):
    assert sample.split_name(name) == parts


@pytest.mark.parametrize("name", ["k", ".k.jpg", "d.r/.jpg", "a.b/k", ""])
def test_a_name_webdataset_puts_in_no_sample_is_refused(name):
    with pytest.raises(ValueError):
        sample.split_name(name)


@pytest.mark.parametrize("key, safe", [("a-b_C9", True), ("a.b", False), ("a/b", False), ("abc\n", False), ("", False)])
def test_safe_keys(key, safe):
    assert sample.is_safe_key(key) is safe
    assert sample.is_safe_key(sample.shard_key(key))


# -- every reader cuts names by the rule --------------------------------------------------------------

_stem = st.text(alphabet="ab-_ ", min_size=1, max_size=4)
_folder = st.text(alphabet="ab.-_ ", min_size=1, max_size=4)
_key = st.builds(lambda folders, stem: "/".join([*folders, stem]), st.lists(_folder, max_size=2), _stem)
_ext = st.text(alphabet="abjpg.", min_size=1, max_size=5).filter(lambda e: e not in ("cls", "jpg", "json"))


@st.composite
def _shard(draw) -> list[tuple[str, dict[str, bytes]]]:
    """Samples with odd keys (dots and spaces in folders, ../) and odd extensions (``a.b``): each
    has a .cls, a .jpg and a .json (what pipe report and pipe labels look for) and maybe more."""
    keys = draw(st.lists(_key, min_size=1, max_size=5).filter(lambda ks: all(a != b for a, b in zip(ks, ks[1:]))))
    out = []
    for key in keys:
        extra = draw(st.lists(_ext, max_size=2, unique=True))
        members = {"cls": b"0", "jpg": b"not a jpeg", **{e: e.encode() for e in extra},
                   "json": json.dumps({"sources": {"image": key}}).encode()}
        out.append((key, members))
    return out


def _write(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> list[int]:
    """The shard as Python's tarfile writes it (an independent writer); each sample's first offset."""
    offsets = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            offsets.append(tar.offset)
            for ext, data in members.items():
                info = tarfile.TarInfo(sample.member_name(key, ext))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return offsets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=_shard())
def test_every_reader_groups_members_as_webdataset_does(tmp_path, samples):
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    from pipeline.check import shard_dir, tarscan
    from pipeline.report import shard as report_shard
    from pipeline.storage import open_folder
    from train import labels
    from train.data import stream

    path = tmp_path / "train-000000.tar"
    offsets = _write(path, samples)
    data = path.read_bytes()
    want = [(key, set(members)) for key, members in samples]

    with open(path, "rb") as f:
        stock = list(group_by_keys({**m, "__url__": "x"} for m in tar_file_iterator(f)))
    assert [(s["__key__"], set(s) - {"__key__", "__url__"}) for s in stock] == want

    end = len(data) - len(tarstream.END_OF_ARCHIVE)
    entry = {"name": path.name, "split": "train", "count": len(samples), "bytes": len(data), "offsets": offsets}
    read = stream.parse_samples(memoryview(data)[offsets[0]:end], entry, 0, len(samples))
    assert [(s.key, set(s.fields)) for s in read] == want
    assert [s.webdataset_sample()["__key__"] for s in read] == [s["__key__"] for s in stock]

    folder = open_folder(tmp_path)
    scan = tarscan.scan_shard((folder, path.name, tarscan.ScanSettings(False, None, "RGB", ("c",))))
    assert scan.keys == [k for k, _ in want] and scan.offsets == offsets

    ends = [*offsets[1:], end]
    assert [set(shard_dir._members(folder, path.name, a, b)) for a, b in zip(offsets, ends)] == [m for _, m in want]

    assert labels.sources(tmp_path, {"shards": [entry]}, {k for k, _ in want}) == {k: k for k, _ in want}

    found: dict = {"c": []}
    report_shard._scan(folder, path.name, ["c"], found, budget=1000)
    firsts = [k for k, _ in want][: report_shard.PER_CLASS]
    assert [item.source for item in found["c"]] == firsts


READERS = ["pipeline/check/tarscan.py", "pipeline/check/shard_dir.py", "pipeline/report/shard.py",
           "train/data/stream.py", "train/labels.py"]


@pytest.mark.parametrize("module", READERS)
def test_readers_cut_member_names_only_by_the_rule(module):
    """No reader partitions a member name on a dot itself: they call `split_name`."""
    tree = ast.parse((ROOT / module).read_text())
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "split_name" in called
    dots = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("partition", "rpartition", "split", "rsplit") and n.args
            and isinstance(n.args[0], ast.Constant) and n.args[0].value == "."]
    assert not dots, dots


# -- the writer's layout ------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30))
def test_layout_follows_the_member_order(flags):
    has_image, has_text = (np.array(c, dtype=bool) for c in zip(*flags))
    lay = sample.layout(has_image, has_text)
    names: list[str] = [""] * lay.count
    for i, m in zip(lay.image_samples, lay.image):
        names[m] = f"{i}.jpg"
    for i, m in zip(lay.text_samples, lay.text):
        names[m] = f"{i}.txt"
    for i, (c, j) in enumerate(zip(lay.cls, lay.meta)):
        names[c], names[j] = f"{i}.cls", f"{i}.json"
    want = [f"{i}.{ext}" for i, (img, txt) in enumerate(flags)
            for ext, there in (("jpg", img), ("txt", txt), ("cls", True), ("json", True)) if there]
    assert names == want
    assert lay.firsts.tolist() == [want.index(f"{i}.cls") - img - txt for i, (img, txt) in enumerate(flags)]


def test_name_rows_are_the_member_names():
    keys = ["k0", "key-1", "x_2"]
    key_bytes = np.frombuffer("".join(keys).encode(), dtype=np.uint8)
    key_at = np.concatenate(([0], np.cumsum([len(k) for k in keys])))
    exts = np.array([1, -1, 2], dtype=np.int8)  # png, none, webp
    lay = sample.layout(exts >= 0, np.array([True, True, False]))
    rows = sample.name_rows(key_at, key_bytes, lay, exts)
    names = [r.tobytes().rstrip(b"\0").decode() for r in rows]
    assert names == ["k0.png", "k0.txt", "k0.cls", "k0.json", "key-1.txt", "key-1.cls", "key-1.json",
                     "x_2.webp", "x_2.cls", "x_2.json"]


def test_sample_bytes_is_what_its_members_take():
    got = sample.sample_bytes(np.array([10, -1]), np.array([-1, 600]), np.array([1, 2]), np.array([30, 40]))
    assert got.tolist() == [3 * (512 + 512), (512 + 1024) + 2 * (512 + 512)]  # header + data padded to a block


def test_pipe_shards_json_members_are_encode_meta(tmp_path):
    """The .json bytes pipe shard assembles from whole columns are `encode_meta`'s, byte for byte."""
    from tests.check_fixtures import read_samples, run_shard
    from tests.clean_dirs import make_clean_dir, simple_specs

    shards = run_shard(make_clean_dir(tmp_path / "clean", simple_specs(12, classes=2, text_every=3)), tmp_path / "shards")
    metas = [m["json"] for tar in sorted(shards.glob("*.tar")) for _, m in read_samples(tar)]
    assert metas and all(sample.encode_meta(json.loads(m)) == m for m in metas)
    assert all(m["cls"] == sample.encode_class(int(m["cls"])) for tar in shards.glob("*.tar") for _, m in read_samples(tar))
