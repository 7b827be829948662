"""An interrupted `pipe shard` resumes: shards it finished are kept (not written again), the rest
written, and the result is byte for byte what an uninterrupted run writes."""

import os
import tarfile

import pytest

from pipeline.shard import stage
from tests.clean_dirs import make_clean_dir, simple_specs

SETTINGS = {"max_count": 5, "val_fraction": 0.2, "workers": 1}
START_SHARD = stage.start_shard


def run(clean, out):
    return stage.run(stage.ShardConfig(clean, out, **SETTINGS), show_progress=False)


def files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def identity(path):
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


@pytest.fixture
def clean(tmp_path):
    return make_clean_dir(tmp_path / "clean", simple_specs(60, classes=3))


def count_writes(monkeypatch, stop_after=None):
    """Record the name of every shard written; with ``stop_after``, interrupt (Ctrl-C) the run then."""
    written = []

    def start_shard(plan, clean_dir, out_dir):
        if stop_after is not None and len(written) == stop_after:
            raise KeyboardInterrupt
        started = START_SHARD(plan, clean_dir, out_dir)
        written.append(plan.name)
        return started

    monkeypatch.setattr(stage, "start_shard", start_shard)
    return written


def test_an_interrupted_run_keeps_the_shards_it_finished(tmp_path, clean, monkeypatch):
    run(clean, tmp_path / "fresh")
    out = tmp_path / "out"
    first = count_writes(monkeypatch, stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        run(clean, out)
    assert len(first) == 4 and not (out / "index.json").exists()
    finished = {name: identity(out / name) for name in first}
    second = count_writes(monkeypatch)
    summary = run(clean, out)
    assert summary["reused_shards"] == 4
    assert not set(second) & set(first)
    assert len(second) + 4 == summary["train_shards"] + summary["val_shards"]
    assert {name: identity(out / name) for name in first} == finished  # not rewritten
    assert files(out) == files(tmp_path / "fresh")


def test_a_damaged_shard_or_a_changed_clean_file_is_written_again(tmp_path, clean, monkeypatch):
    out = tmp_path / "out"
    run(clean, out)
    before = files(out)
    total = len([n for n in before if n.endswith(".tar")])
    shard = out / "train-000001.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    with tarfile.open(out / "val-000000.tar") as tf:  # an image in another shard than the damaged one
        key = tf.getnames()[0].split(".")[0]
    image = next((clean / "data").rglob(f"{key}.jpg"))
    os.utime(image, ns=(1, 1))  # pipe clean rewrote it since (same bytes here, so the same shard)
    written = count_writes(monkeypatch)
    summary = run(clean, out)
    assert sorted(written) == ["train-000001.tar", "val-000000.tar"]
    assert summary["reused_shards"] == total - 2
    assert files(out) == before


def test_a_finished_run_repeated_writes_nothing_and_other_settings_write_everything(tmp_path, clean, monkeypatch):
    out = tmp_path / "out"
    run(clean, out)
    written = count_writes(monkeypatch)
    assert run(clean, out)["reused_shards"] > 0 and written == []
    cfg = stage.ShardConfig(clean, out, **{**SETTINGS, "seed": 1}, overwrite=True)
    assert stage.run(cfg, show_progress=False)["reused_shards"] == 0


def test_the_interrupted_message_says_resume_and_the_rerun_does(tmp_path, clean, cli, monkeypatch):
    out = tmp_path / "out"
    flags = ["--max-count", "5", "--val-fraction", "0.2", "--workers", "1"]
    count_writes(monkeypatch, stop_after=2)
    r = cli("shard", clean, "-o", out, *flags)
    assert r.exit_code == 130 and "run the same command again to resume" in r.stderr
    monkeypatch.undo()
    r = cli("shard", clean, "-o", out, *flags)
    assert r.exit_code == 0, r.stderr
    assert "kept from an earlier run" in r.stdout and "2 shards" in r.stdout


@pytest.mark.parametrize("window", [None, 512])  # 512: every file is streamed through the writer's window
@pytest.mark.parametrize("change", [b"grown", None])
def test_a_clean_file_that_changes_size_while_sharding_stops_the_run(tmp_path, clean, monkeypatch, change, window):
    from pipeline.core.errors import StageFailed
    from pipeline.shard import write

    if window:
        monkeypatch.setattr(write, "WINDOW", window)

    measure = stage.measure

    def measure_then_change_a_file(cfg, samples, is_val, show_progress):  # between load and write
        path = clean / next(t for t in samples.text.to_pylist() if t is not None)
        path.write_bytes(path.read_bytes() + change if change else path.read_bytes()[:-1])
        return measure(cfg, samples, is_val, show_progress)

    monkeypatch.setattr(stage, "measure", measure_then_change_a_file)
    with pytest.raises(StageFailed, match="changed while sharding"):
        run(clean, tmp_path / "out")
