"""Properties of the reader's plan over random shard sizes, world sizes 1-8, workers 0-4 and
batch sizes: exactly once per epoch, equal steps, a new order every epoch, exact resume."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from train.data.plan import Generation, Segment, block_key, epoch_plan, rank_stream, worker_spans

KEY = (0,)


@st.composite
def setups(draw):
    counts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=12))
    world = draw(st.integers(1, 8))
    batch = draw(st.integers(1, 9))
    workers = draw(st.integers(0, 4))
    block = draw(st.integers(0, 17))
    seed = draw(st.integers(0, 2**32))
    total = sum(counts)
    if total < world * batch:  # cannot fill one step: covered by test_too_few_samples_is_an_error
        counts = counts + [world * batch - total + draw(st.integers(0, 30))]
    return counts, world, batch, workers, block, seed


def epoch_streams(counts, world, batch, workers, block, seed, epoch):
    plan = epoch_plan(counts, world, batch, seed, epoch)
    return plan, [rank_stream(plan, r, workers, block, (seed, epoch, r)) for r in range(world)]


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(setups(), st.integers(0, 50))
def test_every_sample_exactly_once_and_equal_steps(setup, epoch):
    counts, world, batch, workers, block, seed = setup
    plan, streams = epoch_streams(counts, world, batch, workers, block, seed, epoch)
    seen = Counter((s, i) for stream in streams for s, i, _ in stream)
    assert max(seen.values()) == 1, "a sample read twice in one epoch"
    every = {(s, i) for s, c in enumerate(counts) for i in range(c)}
    assert set(seen) | set(plan.dropped) == every and not set(seen) & set(plan.dropped)
    assert len(plan.dropped) < world * batch
    assert all(len(stream) == plan.steps * batch for stream in streams)
    assert plan.steps == sum(counts) // (world * batch)


@SETTINGS
@given(setups())
def test_left_out_samples_change_every_epoch_and_order_changes(setup):
    counts, world, batch, workers, _, seed = setup
    # the reading order itself (before the shuffle buffer, which could by chance undo the change
    # when a rank has only a handful of samples) differs every epoch
    runs = [epoch_streams(counts, world, batch, workers, 0, seed, e) for e in range(4)]
    for (p0, s0), (p1, s1) in zip(runs, runs[1:]):
        if p0.dropped:
            assert set(p0.dropped) != set(p1.dropped), "the same samples left out two epochs running"
        if sum(counts) >= 2:
            assert s0 != s1, "two epochs in the same order"


def test_shuffled_order_changes_every_epoch():
    counts = [9, 30, 4, 17]
    orders = [[x for r in range(2) for x in rank_stream(epoch_plan(counts, 2, 4, 1, e), r, 2, 8, (1, e, r))] for e in range(6)]
    assert all(a != b for a, b in zip(orders, orders[1:]))
    assert len({tuple(o[:8]) for o in orders}) == 6  # even the first batches differ


@SETTINGS
@given(setups(), st.integers(0, 20), st.data())
def test_resume_from_any_step_continues_without_repeat_or_skip(setup, epoch, data):
    counts, world, batch, workers, block, seed = setup
    plan = epoch_plan(counts, world, batch, seed, epoch)
    steps_done = data.draw(st.integers(0, plan.steps))
    for r in range(world):
        full = rank_stream(plan, r, workers, block, (seed, epoch, r))
        resumed = rank_stream(plan, r, workers, block, (seed, epoch, r), consumed=steps_done * batch)
        assert resumed == full[steps_done * batch :]


@SETTINGS
@given(setups())
def test_spans_are_contiguous_per_rank_and_worker(setup):
    counts, world, batch, workers, _, seed = setup
    plan = epoch_plan(counts, world, batch, seed, 3)
    for span in plan.spans:
        pieces = worker_spans(span, plan.steps, batch, workers)
        assert [seg for piece in pieces for seg in piece] != [] or plan.steps == 0
        flat = [x for piece in pieces for seg in piece for x in range(seg.begin, seg.end)]
        assert len(flat) == plan.steps * batch
        for piece in pieces:
            assert sum(map(len, piece)) % batch == 0
            # a piece only jumps at a shard's end or over a left-out window: few segments
            assert len(piece) <= 2 * len(counts) + 2


@SETTINGS
@given(setups())
def test_validation_reads_everything_once_with_marked_padding(setup):
    counts, world, batch, workers, block, seed = setup
    plan = epoch_plan(counts, world, batch, seed, 0, train=False)
    streams = [rank_stream(plan, r, workers, 0, (0,)) for r in range(world)]
    assert all(len(s) == plan.steps * batch for s in streams)
    valid = Counter((s, i) for stream in streams for s, i, ok in stream if ok)
    assert valid == Counter({(s, i): 1 for s, c in enumerate(counts) for i in range(c)})
    padding = sum(not ok for stream in streams for *_, ok in stream)
    assert padding < world * batch


def test_world_size_may_change_between_epochs():
    counts = [13, 0, 7, 22, 5]
    for epoch, world in enumerate([1, 3, 2, 8]):
        plan = epoch_plan(counts, world, 2, 11, epoch)
        read = [x for r in range(world) for x in rank_stream(plan, r, 2, 4, (r,))]
        assert len(read) == len(set(read)) == plan.steps * world * 2


def test_too_few_samples_is_an_error():
    with pytest.raises(ValueError, match="cannot fill one step"):
        epoch_plan([3], world=2, batch=2, seed=0, epoch=0)


def test_resume_needs_whole_batches():
    plan = epoch_plan([10], 1, 2, 0, 0)
    with pytest.raises(ValueError, match="whole number of batches"):
        rank_stream(plan, 0, 1, 4, (0,), consumed=3)


def test_segment_length():
    assert len(Segment(0, 3, 7)) == 4


# -- resume on another layout: world size, batch split, workers, shuffle buffer -------------------


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def layout_chains(draw):
    """A dataset, a global batch G, and 1-4 layouts that split G differently, each run for a
    drawn number of optimizer steps (the last to the epoch's end): an epoch resumed on other
    world sizes, per-rank batches, worker counts and shuffle buffers."""
    counts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=10))
    global_batch = draw(st.integers(1, 4)) * draw(st.integers(1, 4)) * draw(st.integers(1, 3))
    if sum(counts) < global_batch:
        counts = counts + [global_batch - sum(counts) + draw(st.integers(0, 40))]
    layouts = []
    for _ in range(draw(st.integers(1, 4))):
        world = draw(st.sampled_from([w for w in _divisors(global_batch) if w <= 8]))
        batch = draw(st.sampled_from(_divisors(global_batch // world)))
        layouts.append((world, batch, global_batch // (world * batch), draw(st.integers(0, 3)), draw(st.integers(0, 9))))
    total_steps = sum(counts) // global_batch
    cuts = sorted(draw(st.lists(st.integers(0, total_steps), min_size=len(layouts) - 1, max_size=len(layouts) - 1)))
    return counts, global_batch, layouts, cuts, draw(st.integers(0, 2**32)), draw(st.integers(0, 30))


def _run_chain(counts, layouts, cuts, seed, epoch):
    """What each generation's ranks consume: [(plan, [keys per rank])] (the last runs to the end)."""
    history, done, out = [], 0, []
    for g, (world, batch, accum, workers, block) in enumerate(layouts):
        plan = epoch_plan(counts, world, batch, seed, epoch, accum=accum, history=tuple(history))
        assert plan.generation == g
        streams = [rank_stream(plan, r, workers, block, block_key(seed, epoch, r, g)) for r in range(world)]
        stop = cuts[g] if g < len(cuts) else None
        steps = (stop - done) * accum if stop is not None else plan.steps
        out.append((plan, [s[: steps * batch] for s in streams], streams))
        if stop is not None:
            history.append(Generation(world, batch, workers, block, steps * batch))
            done = stop
    return out


@SETTINGS
@given(layout_chains())
def test_an_epoch_resumed_on_other_layouts_trains_every_sample_exactly_once(chain):
    counts, global_batch, layouts, cuts, seed, epoch = chain
    gens = _run_chain(counts, layouts, cuts, seed, epoch)
    trained = Counter((s, i) for _, consumed, _ in gens for keys in consumed for s, i, _ in keys)
    assert max(trained.values()) == 1, "a sample trained twice in one epoch"
    dropped = set(gens[0][0].dropped)
    assert all(set(p.dropped) == dropped for p, _, _ in gens)  # the left-out window is the global batch's
    every = {(s, i) for s, c in enumerate(counts) for i in range(c)}
    assert set(trained) | dropped == every and not set(trained) & dropped
    assert len(trained) == sum(counts) // global_batch * global_batch
    for plan, consumed, streams in gens:
        assert len({len(s) for s in streams}) == 1 and len(streams[0]) == plan.steps * plan.batch  # equal steps
        assert len({len(c) for c in consumed}) == 1


@SETTINGS
@given(layout_chains(), st.data())
def test_a_later_generation_resumes_in_its_own_layout_exactly(chain, data):
    counts, _, layouts, cuts, seed, epoch = chain
    gens = _run_chain(counts, layouts, cuts, seed, epoch)
    plan, _, streams = gens[-1]
    world, batch, _, workers, block = layouts[-1]
    steps_done = data.draw(st.integers(0, plan.steps))
    for r in range(world):
        resumed = rank_stream(plan, r, workers, block, block_key(seed, epoch, r, plan.generation), steps_done * batch)
        assert resumed == streams[r][steps_done * batch :]


def test_the_same_layout_is_generation_zero_with_the_key_it_always_had():
    plan = epoch_plan([30, 17, 9], 2, 3, 4, 1)
    assert plan.generation == 0 and block_key(4, 1, 0) == (4, 1, 0)
    assert block_key(4, 1, 0, 1) != block_key(4, 1, 0)


def test_accumulation_cuts_the_epoch_in_whole_global_batches():
    counts = [13, 0, 7, 22, 5]  # 47 samples
    plan = epoch_plan(counts, 2, 3, 0, 0, accum=2)  # global batch 12: 3 optimizer steps, 11 left out
    assert plan.steps == 6 and len(plan.dropped) == 11
    assert epoch_plan(counts, 2, 3, 0, 0).steps == 7  # without accumulation: batches of 6, 5 left out
    with pytest.raises(ValueError, match="cannot fill one step of 2 ranks x batch 3 x accumulation 9"):
        epoch_plan(counts, 2, 3, 0, 0, accum=9)
