"""The reader's byte side: samples read back exactly as tar wrote them, whether a range is
mapped or read (small ranges, network file systems), views that stay valid after their block,
a short shard named rather than a crash, and no torch import on the way."""

import subprocess
import sys
import tarfile

import pytest

from pipeline.shard import stage
from tests.clean_dirs import make_clean_dir, simple_specs
from train.data import sources
from train.data.stream import SampleDecodeError, SampleReader


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    make_clean_dir(root / "clean", simple_specs(40, classes=2, text_every=3))
    stage.run(stage.ShardConfig(root / "clean", root / "shards", max_count=7, val_fraction=0), show_progress=False)
    return root / "shards"


def members_by_tarfile(shard_dir) -> dict[str, dict[str, bytes]]:
    """key -> {ext: bytes} of every train sample, read with Python's tarfile (an independent parser)."""
    out: dict[str, dict[str, bytes]] = {}
    for path in sorted(shard_dir.glob("train-*.tar")):
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return out


def epoch_samples(reader: SampleReader, epoch: int = 0) -> dict[str, dict[str, bytes]]:
    samples = [s for _, s in reader.samples(epoch)]  # all kept alive past their blocks
    return {s.key: {ext: bytes(v) for ext, v in s.fields.items()} for s in samples}


# how a range of samples is read: mapped (large ranges), read into aligned memory (large ranges
# where mapping fails: some network file systems), or read plainly (small ranges)
READ_PATHS = {"mapped": (0, True), "aligned read": (0, False), "small read": (1 << 62, True)}


@pytest.fixture(params=sorted(READ_PATHS))
def read_path(request, monkeypatch):
    map_from, can_map = READ_PATHS[request.param]
    monkeypatch.setattr(sources, "MAP_FROM", map_from)
    monkeypatch.setattr(sources, "_CAN_MAP", can_map)
    return request.param


def test_samples_are_the_tar_members_and_outlive_their_block(shards, read_path):
    reader = SampleReader(shards, batch_size=4, shuffle_buffer=5)  # many small blocks, one sample left out
    got = epoch_samples(reader)
    want = members_by_tarfile(shards)
    assert len(got) == len(want) - len(reader.plan(0).dropped)
    assert all(got[k] == want[k] for k in got)


def test_a_shard_shorter_than_its_index_is_named(tmp_path, read_path):
    make_clean_dir(tmp_path / "clean", simple_specs(6, classes=2))
    stage.run(stage.ShardConfig(tmp_path / "clean", tmp_path / "shards", val_fraction=0), show_progress=False)
    tar = tmp_path / "shards" / "train-000000.tar"
    tar.write_bytes(tar.read_bytes()[:-2000])  # never mapped past its end (that would be SIGBUS, not a message)
    with pytest.raises(SampleDecodeError, match=r"^train-000000\.tar: the file is shorter than index\.json says"):
        list(SampleReader(tmp_path / "shards", batch_size=1, shuffle_buffer=0).samples(0))


def test_reading_does_not_import_torch(shards):
    code = ("import sys; from train.data.stream import SampleReader; "
            f"n = sum(1 for _ in SampleReader({str(shards)!r}, batch_size=4).samples(0)); "
            "assert n > 0 and 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_local_training_run_never_imports_boto3(shards, tmp_path):
    """boto3 is the s3 extra: `pipe train` on a local folder (checks, launch, ranks, workers) must
    run without it. A boto3/botocore that fails on import stands in front of the real ones."""
    from tests.conftest import pipe_env

    for name in ("boto3", "botocore"):
        (tmp_path / "poison" / name).mkdir(parents=True)
        (tmp_path / "poison" / name / "__init__.py").write_text(f"raise ImportError('{name} imported for a local run')\n")
    env = pipe_env()
    env["PYTHONPATH"] = f"{tmp_path / 'poison'}:{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-m", "pipeline", "train", str(shards), "-o", str(tmp_path / "run"),
                           "--data-only", "--workers", "1", "--batch-size", "4", "--verify", "--record-keys",
                           "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "run" / "keys" / "epoch0-rank0.txt").read_text().count("\n") == 40 // 4 * 4


def test_a_reader_travels_to_a_spawned_worker(shards):
    """Where workers are spawned (macOS, Windows) the reader is pickled: it must survive that."""
    import pickle

    reader = SampleReader(shards, batch_size=4)
    next(reader.samples(0))  # descriptors open
    again = pickle.loads(pickle.dumps(reader))
    assert [s.key for _, s in again.samples(1)] == [s.key for _, s in reader.samples(1)]
