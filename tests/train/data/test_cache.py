"""The local shard cache: the same samples as without it, whole verified shards only, the size
cap kept by evicting the least recently used, and several processes sharing one folder."""

import hashlib
import json
import multiprocessing as mp
import os

import pytest

from pipeline.shard import stage
from tests.clean_dirs import make_clean_dir, simple_specs
from train.data.ranges import Retry, ShardReadError
from train.data.sources import CachedSource, LocalSource
from train.data.stream import SampleReader


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    make_clean_dir(root / "clean", simple_specs(40, classes=2, text_every=3))
    stage.run(stage.ShardConfig(root / "clean", root / "shards", max_count=7, val_fraction=0), show_progress=False)
    return root / "shards"


def index_of(shard_dir):
    return json.loads((shard_dir / "index.json").read_text())


def epoch(reader, e=0):
    return [(s.key, {k: bytes(v) for k, v in s.fields.items()}) for _, s in reader.samples(e)]


class Counting(LocalSource):
    """The shard folder, counting the bytes read from it (as an object store would bill them)."""

    def __init__(self, root):
        super().__init__(root)
        self.read_bytes = 0

    def read_range(self, rel, start, length):
        self.read_bytes += length
        return super().read_range(rel, start, length)


def cached_reader(shards, cache, max_bytes=None):
    inner = Counting(shards)
    idx = index_of(shards)
    source = CachedSource(inner, cache, max_bytes, {s["name"]: (s["bytes"], s["sha256"]) for s in idx["shards"]})
    return SampleReader(shards, batch_size=4, shuffle_buffer=5, source=source), inner


def cached_files(cache):
    return sorted(p.name for p in cache.iterdir() if p.suffix == ".tar")


def test_cached_reads_give_the_same_samples_and_read_the_source_once(shards, tmp_path):
    want = [epoch(SampleReader(shards, batch_size=4, shuffle_buffer=5), e) for e in range(2)]
    reader, inner = cached_reader(shards, tmp_path / "cache")
    assert epoch(reader, 0) == want[0]
    first = inner.read_bytes
    assert epoch(reader, 1) == want[1]
    assert inner.read_bytes == first  # the second epoch came from the cache alone
    idx = index_of(shards)
    assert first == sum(s["bytes"] for s in idx["shards"])  # each shard fetched whole, once
    for s in idx["shards"]:  # named by content, complete and correct
        assert hashlib.sha256((tmp_path / "cache" / f"{s['sha256']}.tar").read_bytes()).hexdigest() == s["sha256"]
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]


def test_the_cap_is_kept_by_evicting_the_least_recently_used(shards, tmp_path):
    idx = index_of(shards)
    sizes = sorted(s["bytes"] for s in idx["shards"])
    cap = sizes[-1] + sizes[-2]  # room for two shards at most
    reader, _ = cached_reader(shards, tmp_path / "cache", cap)
    want = epoch(SampleReader(shards, batch_size=4, shuffle_buffer=5), 0)
    assert epoch(reader, 0) == want
    cache = tmp_path / "cache"
    assert sum((cache / n).stat().st_size for n in cached_files(cache)) <= cap
    # the shard used last is kept, the older ones went first
    os.utime(cache / cached_files(cache)[0], (1, 1))
    kept = cached_files(cache)[1]
    source = reader.source
    source.close()
    other = next(s for s in idx["shards"] if f"{s['sha256']}.tar" not in cached_files(cache))
    source.read_range(other["name"], 0, 512)
    assert sorted(cached_files(cache)) == sorted([kept, f"{other['sha256']}.tar"])


def test_a_shard_larger_than_the_cap_is_read_through(shards, tmp_path):
    reader, inner = cached_reader(shards, tmp_path / "cache", max_bytes=1000)
    assert epoch(reader) == epoch(SampleReader(shards, batch_size=4, shuffle_buffer=5))
    assert cached_files(tmp_path / "cache") == []


def test_a_changed_shard_is_named_and_not_cached(shards, tmp_path):
    idx = index_of(shards)
    victim = idx["shards"][0]
    source = CachedSource(LocalSource(shards), tmp_path / "cache", None, {victim["name"]: (victim["bytes"], "0" * 64)},
                          Retry(attempts=1))
    with pytest.raises(ShardReadError, match=rf"^{victim['name']}: does not match index.json's sha256"):
        source.read_range(victim["name"], 0, 512)
    assert os.listdir(tmp_path / "cache") == [f"{'0' * 64}.tar.lock"]


def _worker(shards, cache, cap, e, out):
    reader, _ = cached_reader(shards, cache, cap)
    out.put(epoch(reader, e))


@pytest.mark.parametrize("cap", [None, 65_000])  # unbounded; room for two shards of six
def test_several_processes_share_one_cache_folder(shards, tmp_path, cap):
    want = epoch(SampleReader(shards, batch_size=4, shuffle_buffer=5), 3)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(shards, tmp_path / "cache", cap, 3, out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert all(g == want for g in got)
    idx = {s["sha256"]: s for s in index_of(shards)["shards"]}
    for name in cached_files(tmp_path / "cache"):  # every file in the cache is a complete, correct shard
        assert hashlib.sha256((tmp_path / "cache" / name).read_bytes()).hexdigest() == name[:-4] in idx
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]
    if cap:
        assert sum((tmp_path / "cache" / n).stat().st_size for n in cached_files(tmp_path / "cache")) <= cap
