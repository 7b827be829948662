"""How the reader turns needed samples into reads: merged reads cover every needed byte once, in
order, within the cap unless one sample is larger; transient failures are retried with growing,
jittered waits and then named; reads are fetched ahead on threads but handed back in order."""

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from train.data.ranges import Read, Retry, SampleDecodeError, ShardReadError, Want, plan_reads, prefetched, read_with_retries


@st.composite
def wants(draw):
    """Samples as a reader needs them: runs of adjacent samples in a few objects, runs in any
    order (a shuffled epoch jumps between shards), sometimes a sample needed again (validation)."""
    out = []
    for _ in range(draw(st.integers(0, 8))):
        rel = draw(st.sampled_from(["a.tar", "b.tar", "c.tar"]))
        at = draw(st.integers(0, 10_000))
        for _ in range(draw(st.integers(1, 12))):
            n = draw(st.integers(1, 3_000))
            out.append(Want(rel, at, n, len(out)))
            at += n
    return out


@settings(max_examples=300, deadline=None)
@given(wants(), st.integers(1, 8_000))
def test_reads_cover_every_needed_byte_once_in_order_within_the_cap(ws, cap):
    reads = list(plan_reads(ws, cap))
    assert [w for r in reads for w in r.wants] == ws  # every sample in exactly one read, order kept
    for r in reads:
        assert all(w.rel == r.rel for w in r.wants)
        # the read is exactly its samples back to back: each needed byte once, nothing else
        assert r.start == r.wants[0].start and r.length == sum(w.length for w in r.wants)
        assert all(a.start + a.length == b.start for a, b in zip(r.wants, r.wants[1:]))
        assert r.length <= cap or len(r.wants) == 1
    for a, b in zip(reads, reads[1:]):  # merged as far as allowed: the next read could not have joined
        nxt = b.wants[0]
        assert nxt.rel != a.rel or nxt.start != a.start + a.length or a.length + nxt.length > cap


def test_adjacent_samples_merge_into_reads_of_several_mib():
    ws = [Want("s.tar", i * 100_000, 100_000) for i in range(500)]  # 50 MB of adjacent samples
    reads = list(plan_reads(ws, 8 << 20))
    assert len(reads) == 7 and all(r.length <= 8 << 20 for r in reads)
    assert list(plan_reads([Want("s.tar", 0, 20 << 20)], 8 << 20))[0].length == 20 << 20  # one big sample: alone


class Flaky:
    """A source over in-memory objects that fails the first ``fails`` calls."""

    cap, ahead = 1 << 20, 0

    def __init__(self, fails=0, error=None, transient=True, data=None):
        self.fails, self.is_transient = fails, transient
        self.error = error or ConnectionError("connection reset by peer")
        self.data = data if data is not None else {"x.tar": bytes(range(256)) * 64}
        self.calls = 0
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def read_range(self, rel, start, length):
        with self.lock:
            self.calls += 1
            failing = self.calls <= self.fails
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(0.01)
            if failing:
                raise self.error
            return self.data[rel][start : start + length]
        finally:
            with self.lock:
                self.in_flight -= 1

    def transient(self, exc):
        return self.is_transient

    def url(self, rel):
        return f"s3://bucket/shards/{rel}"

    def close(self):
        pass


FAST = Retry(attempts=6, first=0.001, most=0.01, budget=1.0)


def test_transient_failures_are_retried_with_growing_jittered_waits():
    waits = []
    source = Flaky(fails=4)
    data = read_with_retries(source, Read("x.tar", 10, 20, ()), Retry(attempts=6, first=1.0, most=100.0, budget=1e9),
                             sleep=waits.append)
    assert data == source.data["x.tar"][10:30] and source.calls == 5
    assert len(waits) == 4 and all(0 <= w <= 2**k for k, w in enumerate(waits))
    delays = [list(Retry(first=1.0, most=100.0).delays(random.Random(s))) for s in range(200)]
    assert all(len(d) == 9 for d in delays)
    assert sum(d[8] for d in delays) > 10 * sum(d[0] for d in delays)  # exponential on average
    assert len({d[3] for d in delays}) == 200  # jittered: no two workers wait in step


def test_retries_are_bounded_and_the_error_names_the_shard_url():
    source = Flaky(fails=100, error=ConnectionError("Could not connect to the endpoint URL: \"http://h/b/x.tar?X-Amz-Signature=s3cret\""))
    with pytest.raises(ShardReadError, match=r"^s3://bucket/shards/x\.tar: cannot read bytes 0-10 after 6 tries in 0 s: ") as e:
        read_with_retries(source, Read("x.tar", 0, 10, ()), FAST)
    assert source.calls == 6 and "s3cret" not in str(e.value) and "\n" not in str(e.value)
    slow = Flaky(fails=100)
    began = time.monotonic()
    with pytest.raises(ShardReadError, match="after [0-9]+ tries"):  # the time budget ends it before the tries do
        read_with_retries(slow, Read("x.tar", 0, 10, ()), Retry(attempts=100, first=0.05, most=0.05, budget=0.2))
    assert slow.calls < 50 and time.monotonic() - began < 1
    assert isinstance(e.value, SampleDecodeError)  # the loop's one-line data failure


def test_permanent_failures_and_short_objects_are_not_retried():
    source = Flaky(fails=1, transient=False, error=PermissionError("AccessDenied"))
    with pytest.raises(ShardReadError, match=r"^s3://bucket/shards/x\.tar: cannot read bytes 0-10: AccessDenied$"):
        read_with_retries(source, Read("x.tar", 0, 10, ()), FAST)
    assert source.calls == 1
    short = Flaky()
    with pytest.raises(ShardReadError, match="shorter than index.json says"):
        read_with_retries(short, Read("x.tar", 16_000, 1_000, ()), FAST)
    assert short.calls == 1


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_prefetched_reads_come_back_in_order_with_a_few_in_flight(ahead):
    source = Flaky(fails=2)
    reads = [Read("x.tar", i * 100, 100, ()) for i in range(40)]
    got = list(prefetched(source, reads, ahead, FAST))
    assert [r for r, _ in got] == reads
    assert all(bytes(d) == source.data["x.tar"][r.start : r.start + 100] for r, d in got)
    assert source.most_in_flight == max(1, ahead)


def test_stopping_early_does_not_wait_for_queued_reads():
    source = Flaky()
    it = prefetched(source, [Read("x.tar", i, 1, ()) for i in range(1000)], 3, FAST)
    next(it)
    it.close()
    time.sleep(0.1)
    assert source.calls < 10


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5_000), min_size=1, max_size=40), st.data(), st.integers(1, 12_000))
def test_sample_runs_cut_a_segment_at_sample_boundaries_within_the_cap(sizes, data, cap):
    from train.data.stream import sample_runs

    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    end = sum(sizes)
    begin = data.draw(st.integers(0, len(sizes) - 1))
    stop = data.draw(st.integers(begin + 1, len(sizes)))
    runs = list(sample_runs(offsets, end, begin, stop, cap))
    assert runs[0][0] == begin and runs[-1][1] == stop
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))  # contiguous, in order
    for i, e, start, stop_byte in runs:
        assert start == offsets[i] and stop_byte == (offsets[e] if e < len(sizes) else end)
        assert stop_byte - start <= cap or e == i + 1  # over the cap only as one sample
        if e < stop:  # as long as allowed: one more sample would not fit
            assert (offsets[e + 1] if e + 1 < len(sizes) else end) - start > cap
