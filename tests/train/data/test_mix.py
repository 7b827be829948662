"""Several SHARD_DIRs by weight: exact shares every epoch, even up-sampling, a down-sampled source
continuing its pass, deterministic by seed, exactly once per epoch also when resumed on other
layouts (properties over random sources, weights and layouts); classes merged by name."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import UsageError
from train.data.mix import Mix, Sources, merged_classes, parse_weights, shares, source_names, source_stream
from train.data.plan import Generation, block_key, epoch_plan, rank_stream

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mixes(draw):
    """2-3 sources of random shard sizes, weights 1-5, a global batch split 1-4 ranks x batch x accum."""
    sources = [draw(st.lists(st.integers(0, 30), min_size=1, max_size=5)) for _ in range(draw(st.integers(2, 3)))]
    sources = [c if sum(c) else c + [draw(st.integers(1, 20))] for c in sources]
    weights = tuple(Fraction(draw(st.integers(1, 5))) for _ in sources)
    world, batch, accum = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 2))
    counts = [c for s in sources for c in s]
    bounds = [0]
    for s in sources:
        bounds.append(bounds[-1] + len(s))
    per_step = world * batch * accum
    epoch_samples = draw(st.one_of(st.none(), st.integers(per_step, max(per_step, 3 * sum(counts) + 1))))
    if epoch_samples is None and sum(counts) < world * batch * accum:
        epoch_samples = world * batch * accum
    return sources, counts, Mix(tuple(bounds), weights, epoch_samples), (world, batch, accum), draw(st.integers(0, 2**32))


def _source_of(mix: Mix, shard: int) -> int:
    return next(i for i in range(len(mix.bounds) - 1) if mix.bounds[i] <= shard < mix.bounds[i + 1])


def _epoch(counts, mix, layout, seed, epoch, workers=2, block=5):
    world, batch, accum = layout
    plan = epoch_plan(counts, world, batch, seed, epoch, accum=accum, mix=mix)
    return plan, [x for r in range(world) for x in rank_stream(plan, r, workers, block, block_key(seed, epoch, r))]


@SETTINGS
@given(mixes(), st.integers(0, 6))
def test_each_source_gives_its_exact_share_of_every_epoch(setup, epoch):
    sources, counts, mix, layout, seed = setup
    plan, read = _epoch(counts, mix, layout, seed, epoch)
    per_step = layout[0] * layout[1] * layout[2]
    size = mix.epoch_size(counts, per_step)
    assert len(read) == size and size % per_step == 0 and plan.dropped == ()
    got = Counter(_source_of(mix, s) for s, _, _ in read)
    want = shares(size, mix.weights)
    assert [got[i] for i in range(len(sources))] == want
    for i, n in enumerate(want):  # within one sample of the weight's exact share
        assert abs(n - size * mix.weights[i] / sum(mix.weights)) < 1


@SETTINGS
@given(mixes())
def test_every_source_is_used_evenly_and_continues_its_pass_across_epochs(setup):
    """After every epoch, any two samples of a source were used a number of times that differs by
    at most one: an up-sampled source shows all its samples once before any twice, and a
    down-sampled one shows none twice before its pass is through."""
    sources, counts, mix, layout, seed = setup
    used = Counter()
    for epoch in range(4):
        _, read = _epoch(counts, mix, layout, seed, epoch)
        used.update((s, i) for s, i, _ in read)
        for k in range(len(sources)):
            mine = [used[(s, i)] for s in range(mix.bounds[k], mix.bounds[k + 1]) for i in range(counts[s])]
            assert max(mine) - min(mine) <= 1, f"source {k} used unevenly after epoch {epoch}"


@SETTINGS
@given(mixes(), st.integers(0, 3))
def test_a_mixed_epoch_resumed_on_other_layouts_reads_its_samples_exactly_once(setup, epoch):
    sources, counts, mix, (world, batch, accum), seed = setup
    _, whole = _epoch(counts, mix, (world, batch, accum), seed, epoch)
    g = world * batch * accum
    first = epoch_plan(counts, world, batch, seed, epoch, accum=accum, mix=mix)
    k = first.steps // (2 * accum)  # half the epoch's optimizer steps in the first layout, the rest in one rank
    done = [x for r in range(world) for x in rank_stream(first, r, 2, 5, block_key(seed, epoch, r))[: k * accum * batch]]
    history = (Generation(world, batch, 2, 5, k * accum * batch),)
    rest_plan = epoch_plan(counts, 1, g, seed, epoch, accum=1, history=history, mix=mix)
    rest = rank_stream(rest_plan, 0, 3, 4, block_key(seed, epoch, 0, 1))
    assert Counter(done + rest) == Counter(whole)  # the same multiset: every planned sample once, no more


def test_epochs_are_deterministic_by_seed_and_differ_by_epoch():
    counts, mix = [10, 7, 5, 9], Mix((0, 2, 4), (Fraction(3), Fraction(1)))
    a = _epoch(counts, mix, (2, 2, 1), 7, 1)[1]
    assert a == _epoch(counts, mix, (2, 2, 1), 7, 1)[1]
    assert a != _epoch(counts, mix, (2, 2, 1), 8, 1)[1] and a != _epoch(counts, mix, (2, 2, 1), 7, 2)[1]


def test_source_passes_are_consecutive_orders_of_all_samples():
    counts = [4, 0, 3]
    stream = [(s.shard, i) for s in source_stream(counts, 1, 0, 21) for i in range(s.begin, s.end)]
    passes = [stream[p * 7 : (p + 1) * 7] for p in range(3)]
    assert all(sorted(p) == [(0, i) for i in range(4)] + [(2, i) for i in range(3)] for p in passes)
    later = [(s.shard, i) for s in source_stream(counts, 1, 5, 9) for i in range(s.begin, s.end)]
    assert later == stream[5:14]  # an epoch starts where the previous one stopped


def test_shares_are_largest_remainders():
    assert shares(448, (Fraction(3), Fraction(1))) == [336, 112]
    assert shares(10, (Fraction(1), Fraction(1), Fraction(1))) == [4, 3, 3]
    assert sum(shares(1001, (Fraction(1, 3), Fraction(2, 7), Fraction(5)))) == 1001


def test_weights_one_per_folder_and_positive():
    assert parse_weights("3,1", 2) == (3, 1) and parse_weights(None, 3) == (1, 1, 1)
    assert parse_weights("0.75, 0.25", 2) == (Fraction(3, 4), Fraction(1, 4))
    for text, n, why in (("3,1", 3, "gives 2 weights for 3"), ("3,0", 2, "positive"), ("a,b", 2, "numbers")):
        with pytest.raises(UsageError, match=why):
            parse_weights(text, n)


def test_names_are_short_and_unique():
    assert source_names(["/data/a", "/data/b"]) == ["a", "b"]
    assert source_names(["/x/a/shards", "/x/b/shards"]) == ["a/shards", "b/shards"]
    assert source_names(["s3://bucket/p/shards", "/p/shards"]) == ["source1", "source2"]


def test_classes_merge_by_name_in_first_seen_order():
    indexes = [{"classes": ["cat", "dog"]}, {"classes": ["bird", "cat"]}]
    assert merged_classes(indexes) == ("cat", "dog", "bird")


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    from tests.digits import make_digit_shards

    root = tmp_path_factory.mktemp("mix")
    a = make_digit_shards(root / "a", n=60, classes=3)  # digit0..digit2
    b = make_digit_shards(root / "b", n=40, seed=1, prefix="b", classes=4)  # digit0..digit3
    return a, b


def test_a_reader_over_two_folders_maps_classes_by_name_and_prefixes_keys(two_sources):
    from train.data.reader import ShardReader, close_loader, make_loader

    a, b = two_sources
    dataset = Sources([str(a), str(b)], (Fraction(3), Fraction(1)))
    assert dataset.index["classes"] == ["digit0", "digit1", "digit2", "digit3"]
    reader = ShardReader(a, "train", 0, 1, batch_size=4, seed=3, dataset=dataset, fields=("image",))
    loader = make_loader(reader, 2)
    try:
        reader.set_epoch(0)
        batches = list(loader)
    finally:
        close_loader(loader)
    pairs = [(k, int(y)) for batch in batches for k, y in zip(batch["key"], batch["label"])]
    by_source = Counter(k.split(":")[0] for k, _ in pairs)
    size = len(pairs)
    assert set(by_source) == {"a/shards", "b/shards"} and by_source["a/shards"] == shares(size, dataset.weights)[0]
    # the captions' digit is the class: "bNNNNN" of source b is digit (N mod 4), "dNNNNN" of a digit (N mod 3)
    for key, label in pairs:
        source, _, name = key.partition(":")
        assert label == int(name[1:]) % (3 if source == "a/shards" else 4), key


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_sources_mixed_3_to_1_on_two_ranks_and_resumed_on_one(tmp_path):
    """The issue's drill: digits A (160 train) and B (64 train) mixed 3:1 on 2 CPU ranks, global
    batch 16: every epoch 168 of A (75%) and 56 of B; A is up-sampled evenly (after each epoch no
    sample used twice more than another), B down-sampled: no repeat before its pass is through.
    Killed after step 5 and resumed on 1 rank, the run trains every epoch on the same samples as
    the uninterrupted one."""
    import subprocess
    import sys

    from tests.conftest import REPO, pipe_env
    from tests.digits import make_digit_shards
    from train.components import keys

    a = make_digit_shards(tmp_path / "a", n=200)
    b = make_digit_shards(tmp_path / "b", n=80, seed=1, prefix="b", classes=5)
    flags = ["--mix", "3,1", "--model", "image", "--width", "8", "--epochs", "3", "--global-batch", "16", "--workers",
             "1", "--record-keys", "--checkpoint-every", "3"]

    def train(out: Path, *more: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline", "train", str(a), str(b), "-o", str(out), *flags, *more],
                              capture_output=True, text=True, env={**pipe_env(), **(env or {})}, cwd=REPO, timeout=500)

    p = train(tmp_path / "whole", "--nproc-per-node", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    used = {"a/shards": Counter(), "b/shards": Counter()}
    for epoch in range(3):
        trained, _ = keys.trained_keys(tmp_path / "whole", epoch)
        mine = {s: [k for k in trained if k.startswith(s + ":")] for s in used}
        assert (len(trained), len(mine["a/shards"]), len(mine["b/shards"])) == (224, 168, 56)  # 75%
        for source, got in mine.items():
            used[source].update(got)
        a_uses = [used["a/shards"][f"a/shards:{k}"] for k in keys_of(a)]
        assert max(a_uses) - min(a_uses) <= 1 and min(a_uses) >= epoch + 1  # even: all once before any twice
        b_uses = [used["b/shards"][f"b/shards:{k}"] for k in keys_of(b)]
        assert max(b_uses) - min(b_uses) <= 1  # down-sampled: the pass goes on, no repeat before it is through
        if epoch == 0:
            assert max(b_uses) == 1 and sum(b_uses) == 56
    assert "val_loss/a/shards" in (tmp_path / "whole" / "metrics.jsonl").read_text()

    first = train(tmp_path / "moved", "--nproc-per-node", "2", env={"PIPE_FAULT_KILL_AT_STEP": "5:1"})
    assert first.returncode != 0
    rest = train(tmp_path / "moved", "--resume")  # on 1 rank, global batch kept: batch 16
    assert rest.returncode == 0, rest.stderr[-3000:]
    for epoch in range(3):
        assert Counter(keys.trained_keys(tmp_path / "moved", epoch)[0]) == Counter(
            keys.trained_keys(tmp_path / "whole", epoch)[0])


def keys_of(shards) -> list[str]:
    from tests.digits import keys_by_position

    return list(keys_by_position(shards).values())


def test_the_fingerprint_covers_every_source_the_weights_and_the_epoch_size(two_sources, tmp_path):
    import shutil

    a, b = two_sources
    base = Sources([str(a), str(b)], (Fraction(3), Fraction(1))).fingerprint
    assert Sources([str(a), str(b)], (Fraction(3), Fraction(1))).fingerprint == base
    assert Sources([str(a), str(b)], (Fraction(1), Fraction(1))).fingerprint != base
    assert Sources([str(a), str(b)], (Fraction(3), Fraction(1)), epoch_samples=50).fingerprint != base
    assert Sources([str(b), str(a)], (Fraction(3), Fraction(1))).fingerprint != base
    other = tmp_path / "b" / "shards"
    shutil.copytree(b, other)
    index = other / "index.json"
    index.write_text(index.read_text().replace('"seed": 1', '"seed": 2'))
    assert Sources([str(a), str(other)], (Fraction(3), Fraction(1))).fingerprint != base
