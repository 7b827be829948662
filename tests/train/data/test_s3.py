"""Training data streamed from S3-compatible object storage (a real `rclone serve s3` on
127.0.0.4, tests/s3server.py): the same keys as from a local copy on 2 gloo ranks with
dataloader workers, resume positions that carry over, a shared cache across ranks, an object
store that restarts mid-epoch without changing a key, and a dead store named without a secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.shard import stage
from tests import s3server
from tests.clean_dirs import make_clean_dir, simple_specs
from tests.gloo import run_world
from tests.s3server import SECRET_KEY, free_port
from train.data.plan import epoch_plan, rank_stream
from train.data.ranges import Retry, ShardReadError
from train.data.stream import SampleReader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

BATCH = 2


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """tests/s3server.py's rclone, one for this module: the restart test stops and starts it."""
    server = s3server.start_rclone(tmp_path_factory.mktemp("rclone-train"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, s3_server):
    """Small shards (4 samples each, so an epoch is many reads), on disk and uploaded to a bucket."""
    root = tmp_path_factory.mktemp("s3train")
    make_clean_dir(root / "clean", simple_specs(120, classes=3, text_every=3))
    stage.run(stage.ShardConfig(root / "clean", root / "shards", max_count=4, val_fraction=0.1), show_progress=False)
    bucket = s3_server.make_bucket("train-data")
    client = s3_server.client()
    for path in sorted(p for p in (root / "shards").iterdir() if p.is_file()):
        client.put_object(Bucket=bucket[len("s3://"):], Key=f"runs/a/shards/{path.name}", Body=path.read_bytes())
    return root / "shards", f"{bucket}/runs/a/shards"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    return s3_server


def keys_of(loader) -> list[str]:
    return [k for batch in loader for k in batch["key"]]


# -- 2 gloo ranks (spawned), 2 dataloader workers each ------------------------------------------


def two_rank_scenario(d, scratch: Path) -> dict:
    """On each rank: epochs 0 and 1 and the val split from S3 and from the local copy; a resume
    mid-epoch from S3 with a local run's position; the same through a cache both ranks share."""
    from train.data.reader import ShardReader, close_loader, make_loader

    setup = json.loads((scratch.parent / "setup.json").read_text())

    def read(where, split="train", epochs=(0, 1), state=None, **kw):
        reader = ShardReader(where, split, d.rank, d.world_size, batch_size=BATCH, seed=5, shuffle_buffer=6, **kw)
        loader = make_loader(reader, 2, persistent_workers=True)
        try:
            out = []
            for e in epochs:
                if state is not None:
                    reader.load_state_dict(state)
                else:
                    reader.set_epoch(e)
                out.append(keys_of(loader))
            return out, reader
        finally:
            close_loader(loader)

    local, local_reader = read(setup["local"])
    remote, _ = read(setup["url"])
    local_val, _ = read(setup["local"], "val", epochs=(0,))
    remote_val, _ = read(setup["url"], "val", epochs=(0,))
    local_reader.set_epoch(1)
    state = local_reader.state_dict(steps_done=3)  # as a checkpoint of the local run saves it
    resumed, _ = read(setup["url"], epochs=(1,), state=state)
    cached, _ = read(setup["url"], cache_dir=setup["cache"])
    return {"local": local, "remote": remote, "local_val": local_val, "remote_val": remote_val,
            "resumed": resumed[0], "cached": cached}


@pytest.fixture(scope="module")
def two_ranks(dataset, s3_server, tmp_path_factory):
    local, url = dataset
    workdir = tmp_path_factory.mktemp("gloo-s3")
    (workdir / "setup.json").write_text(json.dumps({"local": str(local), "url": url, "cache": str(workdir / "cache")}))
    with pytest.MonkeyPatch.context() as mp:
        s3_server.setenv(mp)  # inherited by the spawned ranks and their workers
        ranks = run_world([f"{__name__}:two_rank_scenario"], set(), workdir, timeout=400)
    return [r[f"{__name__}:two_rank_scenario"] for r in ranks], workdir


@pytest.mark.slow
def test_keys_from_s3_equal_keys_from_a_local_copy_on_two_ranks(two_ranks, dataset):
    ranks, _ = two_ranks
    local, _ = dataset
    counts = [s["count"] for s in json.loads((local / "index.json").read_text())["shards"] if s["split"] == "train"]
    for got in ranks:
        assert got["remote"] == got["local"] and got["remote_val"] == got["local_val"]
        assert len(got["local"][0]) == epoch_plan(counts, 2, BATCH, 5, 0).steps * BATCH > 0
        assert got["local"][0] != got["local"][1]  # a new order every epoch, the same from either storage
    seen = ranks[0]["remote"][0] + ranks[1]["remote"][0]
    assert len(seen) == len(set(seen))  # each sample once per epoch across the ranks


def test_a_local_runs_position_resumes_on_s3_exactly(two_ranks):
    ranks, _ = two_ranks
    for got in ranks:
        assert got["resumed"] == got["local"][1][3 * BATCH :]


def test_a_cache_shared_by_two_ranks_gives_the_same_keys(two_ranks, dataset):
    ranks, workdir = two_ranks
    local, _ = dataset
    for got in ranks:
        assert got["cached"] == got["local"]
    index = json.loads((local / "index.json").read_text())
    cached = sorted(p.name for p in (workdir / "cache").iterdir() if p.suffix == ".tar")
    assert cached == sorted(f"{s['sha256']}.tar" for s in index["shards"] if s["split"] == "train")


# -- faults --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_object_store_restarts_mid_epoch_and_the_keys_are_unchanged(dataset, s3_env, monkeypatch):
    """rclone is stopped (by PID) and started again on the same port while 2 workers stream an
    epoch. boto3's own retries are off (AWS_MAX_ATTEMPTS=1), so what carries the epoch through is
    the reader's retrying; the keys consumed are exactly those of the local copy."""
    from train.data.reader import ShardReader, close_loader, make_loader

    local, url = dataset
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    want = keys_of(make_loader(ShardReader(local, "train", 0, 1, batch_size=BATCH, seed=3, shuffle_buffer=6), 2))
    reader = ShardReader(url, "train", 0, 1, batch_size=BATCH, seed=3, shuffle_buffer=6)
    loader = make_loader(reader, 2)
    got, restarted_at = [], None
    pid = s3_env.proc.pid
    try:
        for batch in loader:
            got.extend(batch["key"])
            if len(got) == 2 * BATCH:
                s3_env.restart(down_seconds=1.5)
                restarted_at = len(got)
    finally:
        close_loader(loader)
    assert s3_env.proc.pid != pid and restarted_at is not None
    assert len(want) - restarted_at > 20 * BATCH  # most of the epoch was read after the restart
    assert got == want


def test_a_store_that_stays_down_is_named_without_a_secret(dataset, s3_env, monkeypatch):
    _, url = dataset
    reader = SampleReader(url, batch_size=BATCH, shuffle_buffer=6, retry=Retry(attempts=3, first=0.05, budget=5))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.4:{free_port('127.0.0.4')}")  # nothing listens there
    with pytest.raises(ShardReadError) as caught:
        next(reader.samples(0))
    message = str(caught.value)
    assert message.startswith(f"{url}/train-") and "after 3 tries" in message, message
    assert SECRET_KEY not in message and "\n" not in message


@pytest.mark.slow
def test_pipe_train_data_only_from_s3_records_the_planned_keys(dataset, s3_env, tmp_path):
    """The whole command on 2 ranks (our launcher) from s3://, --verify included: the recorded keys
    are exactly the plan's over the local copy (which the local runs are tested to follow)."""
    import subprocess
    import sys
    import tarfile

    from tests.conftest import pipe_env

    local, url = dataset
    env = {**pipe_env(), **s3_env.env}
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "pipeline", "train", url, "-o", str(run), "--data-only", "--verify",
                        "--nproc-per-node", "2", "--workers", "1", "--batch-size", str(BATCH), "--record-keys",
                        "--seed", "4", "--shuffle-buffer", "6"], capture_output=True, text=True, env=env, timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    assert SECRET_KEY not in p.stdout + p.stderr
    index = json.loads((local / "index.json").read_text())
    train = [s for s in index["shards"] if s["split"] == "train"]
    names = {}
    for n, s in enumerate(train):
        with tarfile.open(local / s["name"]) as tf:
            names.update({(n, i): k for i, k in enumerate(dict.fromkeys(m.name.split(".")[0] for m in tf.getmembers()))})
    plan = epoch_plan([s["count"] for s in train], 2, BATCH, 4, 0)
    for r in range(2):
        want = [names[(s, i)] for s, i, _ in rank_stream(plan, r, 1, 6, (4, 0, r))]
        assert (run / "keys" / f"epoch0-rank{r}.txt").read_text().split() == want


def test_s3_reads_are_merged_and_a_worker_makes_its_own_client(dataset, s3_env):
    """Adjacent samples come in one ranged GET each, not one per sample; a forked worker does not
    reuse its parent's client (connection pools must not cross a fork)."""
    import multiprocessing as mp

    from pipeline.storage import s3 as storage_s3

    _, url = dataset
    reader = SampleReader(url, batch_size=BATCH, shuffle_buffer=0)
    calls = []
    original = reader.source.read_range

    def counting(rel, start, length):
        calls.append(length)
        return original(rel, start, length)

    reader.source.read_range = counting
    n = sum(1 for _ in reader.samples(0))
    train = [s for s in reader.index["shards"] if s["split"] == "train"]
    assert n > 0 and len(calls) <= len(train) + 3  # about a read per shard run (4 samples each), not per sample
    storage_s3.client()
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        before = len(storage_s3._clients)  # the parent's client is not inherited for use
        storage_s3.client()
        q.put((before, [key[0] for key in storage_s3._clients]))

    proc = ctx.Process(target=child)
    proc.start()
    before, owners = q.get(timeout=60)
    proc.join(30)
    assert before == 0 and owners == [proc.pid]


def test_a_contrastive_batch_reads_the_same_from_s3(dataset, s3_env):
    """--objective contrastive's fields (issue 22: caption and group ids besides pixels and bytes)
    come out of an s3:// SHARD_DIR as out of its local copy."""
    import torch

    from train.data.reader import ShardReader

    local, url = dataset
    batches = []
    for where in (local, url):
        reader = ShardReader(where, "train", batch_size=8, seed=3, fields=("image", "text", "pairs"))
        reader.set_epoch(0)
        batches.append(next(iter(reader)))
    a, b = batches
    assert a["key"] == b["key"]
    for field in ("image", "text", "caption_id", "group_id", "label"):
        assert torch.equal(a[field], b[field]), field
