"""`pipe shard`: shards plain tar and webdataset can read, byte-identical reruns, limits kept,
a per-class split without near-duplicate leaks, an index that matches its schema and its shards."""

import hashlib
import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from pipeline.core import schemas
from pipeline.formats.sample import decode_image, shard_key
from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir, simple_specs
from tests.conftest import pipe_env
from tests.factories import photo, write


def run(clean, out, **kw):
    return stage.run(stage.ShardConfig(clean, out, **kw), show_progress=False)


def index_of(out):
    return json.loads((out / "index.json").read_text())


def tar_samples(path):
    """key -> {ext: bytes}, read with Python's tarfile."""
    out = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            key, ext = m.name.split(".", 1)
            out.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return out


@pytest.fixture
def clean(tmp_path):
    return make_clean_dir(tmp_path / "clean", simple_specs(40, classes=4) + [Spec("nolabel", None)])


def test_end_to_end_after_real_pipe_clean(tmp_path, cli):
    raw = tmp_path / "raw"
    for i in range(6):
        photo(raw / "cat" / f"c{i}.jpg", 120, 90, seed=i)
        photo(raw / "dog" / f"d{i}.png", 90, 120, seed=100 + i, fmt="PNG")
    write(raw / "cat" / "c0.txt", "a cat, obviously")
    photo(raw / "loose.jpg", 100, 100, seed=50)  # no class folder: no label
    assert cli("clean", raw, "-o", tmp_path / "clean", "--size", "64", "--workers", "1").exit_code == 0
    r = cli("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--val-fraction", "0.34", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    assert "1 kept samples have no label and were left out" in r.stderr
    index = index_of(tmp_path / "shards")
    assert schemas.errors(index, "index") == []
    assert index["classes"] == ["cat", "dog"] and index["image_size"] == 64
    assert index["excluded"]["unlabelled"] == 1
    assert index["counts"]["val"]["per_class"] == {"cat": 2, "dog": 2}
    samples = {k: v for s in index["shards"] for k, v in tar_samples(tmp_path / "shards" / s["name"]).items()}
    assert len(samples) == 12
    assert samples["cat__c0"]["txt"] == b"a cat, obviously"
    meta = json.loads(samples["cat__c0"]["json"])
    assert meta["sources"] == {"image": "cat/c0.jpg", "text": "cat/c0.txt"} and meta["image"] == {"width": 120, "height": 90}
    assert all(set(v) == {"jpg", "cls", "json"} for k, v in samples.items() if k != "cat__c0")


def test_rerun_is_byte_identical_and_seed_matters(tmp_path, clean):
    run(clean, tmp_path / "a", max_count=7, seed=3)
    run(clean, tmp_path / "b", max_count=7, seed=3)
    run(clean, tmp_path / "c", max_count=7, seed=4)
    files = sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_file())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir() if p.is_file())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "train-000000.tar").read_bytes() != (tmp_path / "c" / "train-000000.tar").read_bytes()


def test_inputs_are_not_modified(tmp_path, clean):
    before = {p: p.read_bytes() for p in clean.rglob("*") if p.is_file()}
    run(clean, tmp_path / "out")
    assert before == {p: p.read_bytes() for p in clean.rglob("*") if p.is_file()}


def test_index_matches_the_shards(tmp_path, clean):
    out = tmp_path / "out"
    run(clean, out, max_count=6)
    index = index_of(out)
    assert schemas.errors(index, "index") == []
    assert sorted(s["name"] for s in index["shards"]) == sorted(p.name for p in out.glob("*.tar"))
    for s in index["shards"]:
        data = (out / s["name"]).read_bytes()
        assert len(data) == s["bytes"] and hashlib.sha256(data).hexdigest() == s["sha256"]
        with tarfile.open(out / s["name"]) as tf:
            members = tf.getmembers()
        firsts = [m.offset for i, m in enumerate(members) if i == 0 or m.name.split(".")[0] != members[i - 1].name.split(".")[0]]
        assert firsts == s["offsets"] and len(firsts) == s["count"]
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 for m in members)
    total = index["counts"]["train"]["samples"] + index["counts"]["val"]["samples"]
    assert total == sum(s["count"] for s in index["shards"]) == 40


def test_plain_tar_lists_and_extracts_every_member(tmp_path, clean):
    out = tmp_path / "out"
    run(clean, out)
    listing = subprocess.run(["tar", "tf", str(out / "train-000000.tar")], capture_output=True, text=True, check=True)
    names = listing.stdout.split()
    assert len(names) == len(set(names)) and all(n.count(".") == 1 and "/" not in n for n in names)
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run(["tar", "xf", str(out / "train-000000.tar"), "-C", str(dest)], check=True)
    jpg = next(n for n in names if n.endswith(".jpg"))
    label = json.loads((dest / jpg.replace(".jpg", ".json")).read_text())["label"]
    assert (dest / jpg).read_bytes() == (clean / "data" / label / jpg).read_bytes()


def test_count_and_size_limits(tmp_path):
    rng = np.random.default_rng(0)
    specs = [Spec(f"k{i:03d}", f"c{i % 2}", text="x" * int(rng.integers(0, 6000)), seed=i) for i in range(60)]
    clean = make_clean_dir(tmp_path / "clean", specs + [Spec("huge", "c0", text="y" * 30_000, seed=99)])
    out = tmp_path / "out"
    run(clean, out, max_count=5, max_size=16_384, val_fraction=0)
    index = index_of(out)
    for s in index["shards"]:
        assert s["count"] <= 5
        assert s["bytes"] <= 16_384 or s["count"] == 1, s
    assert any(s["bytes"] > 16_384 and s["count"] == 1 for s in index["shards"])  # only the oversized sample


def test_shards_mix_classes(tmp_path):
    specs = [Spec(f"{c}{i:03d}", c, seed=i + 100 * n) for n, c in enumerate("abc") for i in range(30)]  # sorted by class
    clean = make_clean_dir(tmp_path / "clean", specs)
    run(clean, tmp_path / "out", max_count=10, val_fraction=0)
    for s in index_of(tmp_path / "out")["shards"]:
        labels = {json.loads(v["json"])["label"] for v in tar_samples(tmp_path / "out" / s["name"]).values()}
        assert len(labels) >= 2, f"{s['name']} holds one class"


def test_split_is_per_class_and_keeps_near_duplicates_together(tmp_path):
    base = 0x0123456789ABCDEF
    specs = []
    for i in range(20):
        specs.append(Spec(f"a{i:02d}", "a", seed=i, phash=(base * (i + 1)) & (2**64 - 1)))
    for i in range(6):  # a family of near copies of one image (2 bits apart each, chained)
        specs.append(Spec(f"n{i:02d}", "a", seed=100 + i, phash=base ^ ((1 << (2 * i)) | (1 << (2 * i + 1)))))
    for i in range(5):
        specs.append(Spec(f"b{i:02d}", "b", seed=200 + i, phash=((i + 7) * 0x9E3779B97F4A7C15) & (2**64 - 1)))
    specs.append(Spec("lonely", "c", seed=300))
    clean = make_clean_dir(tmp_path / "clean", specs)
    out = tmp_path / "out"
    run(clean, out, val_fraction=0.2, split_distance=4)
    index = index_of(out)
    side = {}
    for s in index["shards"]:
        for k in tar_samples(out / s["name"]):
            side[k] = s["split"]
    assert len({side[f"n{i:02d}"] for i in range(6)}) == 1, "near duplicates on both sides of the split"
    val = index["counts"]["val"]["per_class"]
    assert val.get("b") == 1 and "c" not in val  # every class with two or more samples is in val
    assert 1 <= val.get("a", 0) <= 6 + 5
    assert index["near_duplicate_groups"]["samples"] >= 6


def test_keys_are_safe_unique_and_short(tmp_path):
    long_a = "x" * 90 + "_a"
    long_b = "x" * 90 + "_b"
    clean = make_clean_dir(tmp_path / "clean", [Spec(long_a, "c"), Spec(long_b, "c", seed=1), Spec("ok-key_1", "c", seed=2)])
    run(clean, tmp_path / "out", val_fraction=0)
    keys = list(tar_samples(tmp_path / "out" / "train-000000.tar"))
    assert len(set(keys)) == 3 and all(len(k) <= 80 and "." not in k for k in keys)
    assert shard_key(long_a) in keys and "ok-key_1" in keys


def test_mean_and_std_are_the_train_pixels(tmp_path, clean):
    out = tmp_path / "out"
    run(clean, out, val_fraction=0.25)
    index = index_of(out)
    pixels = [decode_image(v["jpg"], "jpg").reshape(-1, 3)
              for s in index["shards"] if s["split"] == "train"
              for v in tar_samples(out / s["name"]).values()]
    allpx = np.concatenate(pixels).astype(np.float64) / 255
    assert np.allclose(index["mean"], allpx.mean(axis=0), atol=1e-9)
    assert np.allclose(index["std"], allpx.std(axis=0), atol=1e-9)


def test_measuring_in_worker_processes_gives_the_same_index(tmp_path, monkeypatch):
    clean = make_clean_dir(tmp_path / "clean", simple_specs(80, classes=2))
    run(clean, tmp_path / "a", workers=1)
    monkeypatch.setattr(stage, "IN_PROCESS_BELOW", 0)
    run(clean, tmp_path / "b", workers=2)
    assert (tmp_path / "a" / "index.json").read_bytes() == (tmp_path / "b" / "index.json").read_bytes()


def test_rerun_removes_stale_shards(tmp_path, clean):
    out = tmp_path / "out"
    run(clean, out, max_count=3)
    run(clean, out, max_count=100, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [".pipe", "index.json", "train-000000.tar", "val-000000.tar"]


def test_readers_warning_names_a_max_count_that_fixes_it(tmp_path, clean):
    first = run(clean, tmp_path / "a", expected_ranks=2, expected_workers=3)
    warning = next(w for w in first["warnings"] if "readers" in w)
    fix = int(warning.split("--max-count ")[1].split()[0])
    second = run(clean, tmp_path / "b", expected_ranks=2, expected_workers=3, max_count=fix)
    assert not any("readers" in w for w in second["warnings"])
    assert second["train_shards"] >= 6


@pytest.mark.parametrize("setup,expect", [
    ("no_manifest", "has no manifest.parquet"),
    ("missing_file", "is missing"),
    ("foreign_output", "did not write"),
    ("all_unlabelled", "no kept, labelled samples"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, pipe_proc, setup, expect):
    clean, out = tmp_path / "clean", tmp_path / "out"
    if setup == "no_manifest":
        clean.mkdir()
    elif setup == "missing_file":
        make_clean_dir(clean, simple_specs(3))
        next(clean.rglob("*.jpg")).unlink()
    elif setup == "foreign_output":
        make_clean_dir(clean, simple_specs(3))
        write(out / "notes.txt", "mine")
    else:
        make_clean_dir(clean, [Spec("a", None), Spec("b", None, seed=1)])
    p = pipe_proc("shard", clean, "-o", out)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and expect in lines[0], p.stderr
    if setup == "foreign_output":
        assert (out / "notes.txt").read_text() == "mine"


def test_bad_flags_are_usage_errors(cli, clean, tmp_path):
    for flags in (["--val-fraction", "1"], ["--max-count", "0"], ["--max-size", "10"], ["--split-distance", "40"],
                  ["--seed", "-1"]):
        r = cli("shard", clean, "-o", tmp_path / "out", *flags)
        assert r.exit_code == 2 and "error" in r.stderr, flags


def test_config_file_sets_flags_and_command_line_wins(cli, clean, tmp_path):
    cfg = write(tmp_path / "pipe.toml", "[shard]\nmax_count = 4\nval_fraction = 0.0\n")
    assert cli("shard", clean, "-o", tmp_path / "a", "--config", cfg).exit_code == 0
    assert {s["count"] for s in index_of(tmp_path / "a")["shards"]} == {4}
    assert cli("shard", clean, "-o", tmp_path / "b", "--config", cfg, "--max-count", "20").exit_code == 0
    assert max(s["count"] for s in index_of(tmp_path / "b")["shards"]) == 20
    bad = write(tmp_path / "bad.toml", "[shard]\nmax_cuont = 4\n")
    assert cli("shard", clean, "-o", tmp_path / "c", "--config", bad).exit_code == 2


def test_config_schema_lists_every_shard_setting():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(stage.ShardConfig)} - {"input", "output"}
    assert set(schemas.load_schema("config")["properties"]["shard"]["properties"]) == fields


def test_shard_does_not_import_torch(tmp_path, clean):
    code = (f"import sys; from pathlib import Path; from pipeline.shard import stage as shard; "
            f"shard.run(shard.ShardConfig(Path({str(clean)!r}), Path({str(tmp_path / 'o')!r})), show_progress=False); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


def test_other_settings_are_refused_unless_overwrite(tmp_path, clean, cli):
    out = tmp_path / "out"
    run(clean, out, max_count=7)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = cli("shard", clean, "-o", out, "--max-count", "5")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--max-count 7 -> 5" in lines[0], r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert cli("shard", clean, "-o", out, "--max-count", "7").exit_code == 0  # same settings: the same bytes again
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert cli("shard", clean, "-o", out, "--max-count", "5", "--overwrite").exit_code == 0
    assert {s["count"] for s in index_of(out)["shards"]} <= {1, 2, 3, 4, 5}
    assert schemas.errors(json.loads((out / ".pipe" / "state.json").read_text()), "state") == []


def test_shards_pipe_shard_did_not_write_are_never_replaced(tmp_path, clean, cli):
    theirs = tmp_path / "theirs"
    write(theirs / "train-000000.tar", b"their own shard")
    write(theirs / "index.json", '{"their": "index"}')
    for flags in ([], ["--overwrite"]):
        r = cli("shard", clean, "-o", theirs, *flags)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and "did not write" in lines[0], r.stderr
    assert sorted(p.name for p in theirs.iterdir()) == ["index.json", "train-000000.tar"]
    assert (theirs / "train-000000.tar").read_bytes() == b"their own shard"


def test_a_second_run_into_a_shard_dir_being_written_stops_with_one_line(tmp_path, clean, cli):
    import fcntl

    out = tmp_path / "out"
    run(clean, out)
    index = (out / "index.json").read_bytes()
    (out / ".pipe").mkdir(exist_ok=True)
    with open(out / ".pipe" / "lock", "a") as held:  # what a run in progress holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = cli("shard", clean, "-o", out)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1 and "being written by another run" in lines[0], r.stderr
        assert (out / "index.json").read_bytes() == index  # not removed from under the run in progress
    assert cli("shard", clean, "-o", out).exit_code == 0


def test_a_disk_full_failure_leaves_no_temporary_tar(tmp_path, clean, monkeypatch):
    import errno
    import os

    from pipeline.core.errors import StageFailed

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "out"
    monkeypatch.setattr(os, "fsync", disk_full)  # the shard's bytes reach the disk here, and do not fit
    with pytest.raises(StageFailed, match="No space left"):
        run(clean, out)
    assert not [p.name for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not list(out.glob("*.tar")) and not (out / "index.json").exists()
    monkeypatch.undo()
    run(clean, out)  # space freed: the same command finishes
    assert (out / "index.json").exists()


# -- image-caption pairs without labels (issue 22, item 0) ---------------------------------------


def _captioned(n_labelled: int, n_pairs: int) -> list[Spec]:
    labelled = [Spec(key=f"l{i:03d}", label=f"c{i % 2}", seed=i, text=f"labelled {i}",
                     phash=(i * 0x9E3779B97F4A7C15) & (2**64 - 1)) for i in range(n_labelled)]
    pairs = [Spec(key=f"p{i:03d}", label=None, seed=100 + i, text=f"a pair without a class {i}",
                  phash=((100 + i) * 0x9E3779B97F4A7C15) & (2**64 - 1)) for i in range(n_pairs)]
    alone = [Spec(key="z-image-alone", label=None, seed=999), Spec(key="z-text-alone", label=None, image=False, text="t")]
    return labelled + pairs + alone


def test_pairs_without_labels_are_samples_without_a_cls_member(tmp_path):
    clean = make_clean_dir(tmp_path / "clean", _captioned(8, 10))
    summary = run(clean, tmp_path / "out", val_fraction=0.2)
    index = index_of(tmp_path / "out")
    assert schemas.errors(index, "index") == []
    assert index["classes"] == ["c0", "c1"]
    assert summary["unlabelled"] == index["excluded"]["unlabelled"] == 2  # the image alone and the text alone
    counts = index["counts"]
    assert counts["train"]["samples"] + counts["val"]["samples"] == 18
    assert sum(sum(counts[s]["per_class"].values()) for s in ("train", "val")) == 8
    assert counts["val"]["samples"] - sum(counts["val"]["per_class"].values()) == 2  # the pairs split like a class
    samples = {k: v for p in sorted((tmp_path / "out").glob("*.tar")) for k, v in tar_samples(p).items()}
    assert set(samples) == {f"l{i:03d}" for i in range(8)} | {f"p{i:03d}" for i in range(10)}
    for key, members in samples.items():
        meta = json.loads(members["json"])
        if key.startswith("p"):
            assert set(members) == {"jpg", "txt", "json"} and meta["label"] is None
        else:
            assert set(members) == {"jpg", "txt", "cls", "json"} and meta["label"] == f"c{int(key[1:]) % 2}"


def test_webdataset_reads_pairs_without_labels(tmp_path):
    webdataset = pytest.importorskip("webdataset")
    clean = make_clean_dir(tmp_path / "clean", _captioned(4, 6))
    run(clean, tmp_path / "out")
    urls = [str(p) for p in sorted((tmp_path / "out").glob("*.tar"))]
    got = {s["__key__"]: s for s in webdataset.WebDataset(urls, shardshuffle=False)}
    assert len(got) == 10
    assert all("cls" not in s for k, s in got.items() if k.startswith("p"))


def test_a_pair_in_a_near_duplicate_group_records_it(tmp_path):
    """Near copies of one image with two captions, and one of them labelled: the pairs name the group's
    first sample in their .json (keys sorted: "group" first); samples alone and images without a
    caption record nothing, so a labelled dataset's shards keep their bytes."""
    base = 0x0123456789ABCDEF
    specs = [Spec(key="a1", label=None, seed=1, text="one", phash=base),
             Spec(key="a2", label=None, seed=2, text="two", phash=base ^ 0b11),
             Spec(key="a3", label="c", seed=3, phash=base ^ 0b101),  # no caption: nothing recorded
             Spec(key="b1", label=None, seed=4, text="alone", phash=base ^ (2**64 - 1)),
             Spec(key="c1", label="c", seed=5, text="labelled", phash=0x5555_5555_5555_5555)]
    clean = make_clean_dir(tmp_path / "clean", specs)
    run(clean, tmp_path / "out", val_fraction=0.0, max_count=2)  # shards of 2: each plan entry a part of the columns
    samples = {k: v for p in sorted((tmp_path / "out").glob("*.tar")) for k, v in tar_samples(p).items()}
    assert samples["a1"]["json"].startswith(b'{"group":"a1",') and json.loads(samples["a2"]["json"])["group"] == "a1"
    for key in ("a3", "b1", "c1"):
        assert "group" not in json.loads(samples[key]["json"]), key
    shards = index_of(tmp_path / "out")["shards"]
    assert sum(s["bytes"] for s in shards) == sum((tmp_path / "out" / s["name"]).stat().st_size for s in shards)
