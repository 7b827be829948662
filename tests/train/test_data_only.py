"""`pipe train --data-only` under real launchers: 2 gloo ranks under an external torchrun for
3 epochs on deliberately uneven shards, our own --nproc-per-node launch, a single rank, and a
failing rank. The recorded key files must show every property the plan promises."""

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir
from tests.conftest import pipe_env
from train.data.plan import epoch_plan, rank_stream

BATCH = 3


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Shards of very different sample counts: captions from empty to 7 KB under a 16 KB cap."""
    root = tmp_path_factory.mktemp("uneven")
    rng = np.random.default_rng(7)
    specs = [Spec(f"k{i:03d}", f"c{i % 3}", seed=i, size=16, text="t" * int(rng.choice([0, 40, 3000, 7000])))
             for i in range(70)]
    make_clean_dir(root / "clean", specs)
    stage.run(stage.ShardConfig(root / "clean", root / "shards", max_count=12, max_size=16_384, val_fraction=0.1),
              show_progress=False)
    counts = [s["count"] for s in json.loads((root / "shards" / "index.json").read_text())["shards"] if s["split"] == "train"]
    assert len(set(counts)) >= 3, counts  # really uneven
    return root / "shards"


def train_keys(shards):
    index = json.loads((shards / "index.json").read_text())
    import tarfile

    names = {}
    for n, s in enumerate(x for x in index["shards"] if x["split"] == "train"):
        with tarfile.open(shards / s["name"]) as tf:
            keys = list(dict.fromkeys(m.name.split(".")[0] for m in tf.getmembers()))
        names.update({(n, i): k for i, k in enumerate(keys)})
    counts = [s["count"] for s in index["shards"] if s["split"] == "train"]
    return names, counts


def read_keys(run, epoch, rank):
    return (run / "keys" / f"epoch{epoch}-rank{rank}.txt").read_text().split()


def assert_epoch_properties(shards, run, epochs, world, workers, seed=0, buffer=512):
    names, counts = train_keys(shards)
    everything = set(names.values())
    orders, left_out = [], []
    for e in range(epochs):
        per_rank = [read_keys(run, e, r) for r in range(world)]
        plan = epoch_plan(counts, world, BATCH, seed, e)
        assert len({len(k) for k in per_rank}) == 1 and len(per_rank[0]) == plan.steps * BATCH  # equal steps
        seen = [k for keys in per_rank for k in keys]
        assert max(Counter(seen).values()) == 1  # nothing twice
        assert len(everything - set(seen)) < world * BATCH  # at most world x batch - 1 left out
        for r in range(world):  # exactly the planned order, shuffle buffer and worker round-robin included
            want = [names[(s, i)] for s, i, _ in rank_stream(plan, r, workers, buffer, (seed, e, r))]
            assert per_rank[r] == want
        orders.append(per_rank)
        left_out.append(everything - set(seen))
    assert all(a != b for a, b in zip(orders, orders[1:])), "two epochs in the same order"
    assert all(a != b for a, b in zip(left_out, left_out[1:]) if a), "the same samples left out twice"


def clean_exit(p):
    assert p.returncode == 0, p.stdout + p.stderr
    assert "terminate called" not in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_two_ranks_under_torchrun_three_epochs(uneven, tmp_path):
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "pipeline", "train", str(uneven), "-o", str(run), "--data-only", "--epochs", "3",
                        "--batch-size", str(BATCH), "--workers", "2", "--record-keys"],
                       capture_output=True, text=True, env=pipe_env(), timeout=240)
    clean_exit(p)
    assert_epoch_properties(uneven, run, epochs=3, world=2, workers=2)
    for e in range(3):
        for r in range(2):
            assert f"epoch {e} rank {r} " in p.stdout and "samples/s" in p.stdout


@pytest.mark.slow
def test_own_elastic_launch_with_workerless_ranks(uneven, tmp_path, pipe_proc):
    run = tmp_path / "run"
    p = pipe_proc("train", uneven, "-o", run, "--data-only", "--nproc-per-node", "2", "--workers", "0",
                  "--batch-size", BATCH, "--record-keys", "--seed", "9", timeout=240)
    clean_exit(p)
    assert_epoch_properties(uneven, run, epochs=1, world=2, workers=0, seed=9)


@pytest.mark.slow
def test_single_rank_in_process(uneven, tmp_path, pipe_proc):
    p = pipe_proc("train", uneven, "-o", tmp_path / "run", "--data-only", "--batch-size", BATCH, "--workers", "1",
                  "--record-keys", timeout=240)
    clean_exit(p)
    assert "epoch 0 rank 0 " in p.stdout
    assert_epoch_properties(uneven, tmp_path / "run", epochs=1, world=1, workers=1)


@pytest.mark.slow
def test_failing_rank_is_named_and_exit_1(uneven, tmp_path, pipe_proc):
    import shutil
    import tarfile

    shards = tmp_path / "shards"
    shutil.copytree(uneven, shards)
    target = shards / "train-000000.tar"
    with tarfile.open(target) as tf:
        victim = next(m for m in tf.getmembers() if m.name.endswith(".jpg"))
    data = bytearray(target.read_bytes())
    data[victim.offset_data : victim.offset_data + victim.size] = bytes(victim.size)  # same size, not a JPEG
    target.write_bytes(bytes(data))
    p = pipe_proc("train", shards, "-o", tmp_path / "run", "--data-only", "--nproc-per-node", "2", "--workers", "1",
                  "--batch-size", BATCH, "--epochs", "2", timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    last = p.stderr.strip().splitlines()[-1]
    key = victim.name.split(".")[0]
    assert last.startswith("pipe: failed: rank ") and f"train-000000.tar: sample {key}" in last, p.stderr


@pytest.mark.parametrize("flags,expect", [
    (["--batch-size", "1000"], "cannot fill one step"),
    (["--nnodes", "2"], "--master-port"),
    (["--node-rank", "3"], "--node-rank"),
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "2", "--global-batch", "7"], "not a multiple"),
])
def test_usage_errors_before_any_rank_starts(uneven, tmp_path, cli, flags, expect):
    args = ["train", uneven, "-o", tmp_path / "run", *flags, "--data-only"]
    r = cli(*args)
    assert r.exit_code == 2 and expect in r.stderr, r.stderr


def test_missing_index_is_usage_error(tmp_path, cli):
    r = cli("train", tmp_path, "-o", tmp_path / "run", "--data-only")
    assert r.exit_code == 2 and "index.json not found" in r.stderr


def test_train_command_does_not_import_torch():
    code = ("import sys; import train.command, train.config, train.distributed.launch; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


def test_config_schema_lists_every_train_setting():
    import dataclasses

    from pipeline.core import schemas
    from train.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(schemas.load_schema("config")["properties"]["train"]["properties"]) == fields
