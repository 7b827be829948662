"""Batches onto the device: uint8 batches normalised a whole batch at once give the float tensors the
workers give today; JPEGs left for the device to decode (--decode gpu) come back, through the CPU
fallback, as the same samples in the same order with the same pixels; the GPU feed's prefetch
thread (`ahead`) and its event order, over stand-ins for torch.cuda. (The GPU side itself, nvJPEG,
the side stream and record_stream, runs only in bench/gpu_check.sh.)"""

import threading
import time

import pytest
import torch

from tests.train.data.test_reader import _damaged_copy, big_shards, shards  # noqa: F401 - fixtures
from train.data.device import DeviceFeed, Reused, ahead, normalize_batch
from train.data.reader import ShardReader, close_loader, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
CPU = torch.device("cpu")


def _batches(reader, workers, epoch=0):
    reader.set_epoch(epoch)
    loader = make_loader(reader, workers)
    try:
        return list(loader)
    finally:
        close_loader(loader)


def _fed(reader, workers, channels_last=False):
    """The feed's batches (CPU: JPEGs left to the device are decoded by the CPU fallback)."""
    reader.set_epoch(0)
    loader = make_loader(reader, workers)
    try:
        return list(DeviceFeed(loader, CPU, reader, channels_last))
    finally:
        close_loader(loader)


def _same_tensors(ours, today):
    assert [b["key"] for b in ours] == [b["key"] for b in today]
    for a, b in zip(ours, today):
        assert a["image"].dtype == b["image"].dtype == torch.float32
        assert a["image"].shape == b["image"].shape and a["image"].is_contiguous()
        # the same float operations, a batch at a time instead of an image at a time
        torch.testing.assert_close(a["image"], b["image"], rtol=0, atol=1e-6)
        assert torch.equal(a["has_image"], b["has_image"]) and torch.equal(a["label"], b["label"])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("size", [24, 96])  # DCT-domain shrink + Lanczos-3, and the stored size (JPEG and PNG)
def test_uint8_batches_normalised_at_once_are_todays_float_batches(big_shards, workers, size):  # noqa: F811
    def reader(**kw):
        return ShardReader(big_shards, "train", batch_size=4, seed=3, fields=("image",), image_size=size, **kw)

    raw = _batches(reader(normalize=False), workers)
    assert raw[0]["image"].dtype == torch.uint8 and raw[0]["image"].shape == (4, 3, size, size)
    _same_tensors(_fed(reader(normalize=False), workers), _batches(reader(), workers))


@pytest.mark.parametrize("split", ["train", "val"])
def test_slots_without_an_image_stay_the_mean_colour(shards, split):  # noqa: F811
    def reader(**kw):
        return ShardReader(shards, split, batch_size=5, seed=2, fields=("image", "text"), **kw)

    today = _batches(reader(), 0)
    if split == "val":  # the repeats that fill the last batch are there too
        assert not all(b["valid"].all() for b in today)
    blank = [b for b in today if "blank" in b["key"]]  # the fixture's sample without an image, in one split
    assert all(not b["has_image"][b["key"].index("blank")] for b in blank)
    _same_tensors(_fed(reader(normalize=False), 0), today)


def test_normalize_batch_masks_and_keeps_any_layout():
    image = torch.randint(0, 256, (3, 4, 4, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # channels-last view
    scale, shift = torch.tensor([0.5, 1.0, 2.0]).view(1, 3, 1, 1), torch.tensor([-1.0, 0.0, 1.0]).view(1, 3, 1, 1)
    has = torch.tensor([True, False, True])
    out = normalize_batch(image, has, scale, shift)
    want = image.float() * scale + shift
    want[1] = 0
    assert out.is_contiguous() and torch.equal(out, want)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("size", [24, 96])
def test_channels_last_feed_is_bit_for_bit_the_nchw_feed_and_needs_no_transpose(big_shards, workers, size):  # noqa: F811
    """For a model that runs channels-last (a CPU rank's built-in model) the feed normalises into
    channels-last batches: the very floats of the NCHW feed, and to_device hands them to the model
    without a copy."""
    from train.components.device import to_device

    def reader():
        return ShardReader(big_shards, "train", batch_size=4, seed=3, fields=("image",), image_size=size,
                           normalize=False)

    cl, nchw = _fed(reader(), workers, channels_last=True), _fed(reader(), workers)
    assert [b["key"] for b in cl] == [b["key"] for b in nchw] and len(cl) > 2
    for a, b in zip(cl, nchw):
        assert a["image"].is_contiguous(memory_format=torch.channels_last) and b["image"].is_contiguous()
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["has_image"], b["has_image"])
        assert to_device(a, CPU, channels_last=True)["image"].data_ptr() == a["image"].data_ptr()  # no transpose left


def test_channels_last_feed_keeps_the_mean_colour_where_a_slot_has_no_image(shards):  # noqa: F811
    def reader(**kw):
        return ShardReader(shards, "val", batch_size=5, seed=2, fields=("image", "text"), **kw)

    cl, nchw = _fed(reader(normalize=False), 0, channels_last=True), _fed(reader(normalize=False), 0)
    assert any(not b["has_image"].all() for b in cl)
    for a, b in zip(cl, nchw):
        assert a["image"].is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a["image"], b["image"])
    _same_tensors(nchw, _batches(reader(), 0))


def test_normalize_batch_into_channels_last_is_the_nchw_result():
    torch.manual_seed(1)
    image = torch.randint(0, 256, (3, 5, 5, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # as the workers ship it
    scale, shift = torch.tensor([0.3, 1.7, 2.0]).view(1, 3, 1, 1), torch.tensor([-1.5, 0.25, 1.0]).view(1, 3, 1, 1)
    has = torch.tensor([True, False, True])
    nchw = normalize_batch(image, has, scale, shift)
    cl = normalize_batch(image, has, scale, shift, out=torch.empty(image.shape, memory_format=torch.channels_last))
    assert cl.is_contiguous(memory_format=torch.channels_last) and torch.equal(cl, nchw)
    # from an NCHW uint8 batch too (not interleaved: the per-image path), and into a given batch
    into = torch.empty(image.shape, memory_format=torch.channels_last)
    out = normalize_batch(image.contiguous(), has, scale, shift, out=into)
    assert out is into and torch.equal(out, nchw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("size", [24, 96])
def test_gpu_decode_falls_back_to_the_cpu_decoder_with_the_same_samples_in_order(big_shards, workers, size):  # noqa: F811
    def reader(**kw):
        return ShardReader(big_shards, "train", batch_size=4, seed=7, fields=("image",), image_size=size, **kw)

    left = _batches(reader(decode="gpu"), workers)
    assert all(b["jpeg_offsets"].shape == (5,) for b in left)
    assert sum(int(b["jpeg_offsets"][-1]) for b in left) > 0  # JPEGs were left undecoded (PNGs were not)
    # no GPU here: the feed decodes them with the CPU decoder, into the same slots
    _same_tensors(_fed(reader(decode="gpu"), workers), _batches(reader(), workers))


@pytest.mark.parametrize("refuse", ["some", "all"])
def test_jpegs_nvjpeg_refuses_go_to_the_cpu_decoder_in_their_own_slots(big_shards, monkeypatch, refuse):  # noqa: F811
    """nvJPEG stood in for by the CPU decoder on the first JPEG of each batch and refusing the rest
    (or all of them): the batches are today's; refusing all of two batches in a row stops asking it."""
    from train.data import device as feed_module
    from train.data.reader import decode_at

    asked = []

    def fake_gpu(image, data, bounds, slots):
        asked.append(len(slots))
        if refuse == "all":
            return slots
        raw = data.numpy()
        i = slots[0]
        arr = decode_at(raw[bounds[i]:bounds[i + 1]].tobytes(), "jpg", stored, image.shape[-1])
        image[i].copy_(torch.from_numpy(arr).permute(2, 0, 1))
        return slots[1:]

    monkeypatch.setattr(feed_module, "_decode_gpu", fake_gpu)

    def reader(**kw):
        return ShardReader(big_shards, "train", batch_size=4, seed=7, fields=("image",), image_size=24, **kw)

    r = reader(decode="gpu")
    stored = r.stored_size
    r.set_epoch(0)
    loader = make_loader(r, 0)
    try:
        feed = DeviceFeed(loader, CPU, r)
        feed.gpu_decode = True  # as on a GPU
        if refuse == "all":
            with pytest.warns(RuntimeWarning, match="refused every JPEG of 2 batches"):
                ours = list(feed)
        else:
            ours = list(feed)
    finally:
        close_loader(loader)
    _same_tensors(ours, _batches(reader(), 0))
    with_jpegs = sum(int(b["jpeg_offsets"][-1]) > 0 for b in _batches(reader(decode="gpu"), 0))
    assert with_jpegs > 2 and len(asked) == (2 if refuse == "all" else with_jpegs)
    assert feed.gpu_decode == (refuse != "all")


@pytest.mark.parametrize("workers", [0, 2])
def test_gpu_decode_skips_a_damaged_jpeg_in_the_worker_as_the_cpu_path_does(shards, tmp_path, workers):  # noqa: F811
    from tests.train.data.test_reader import _zero_image

    copy, shard, key = _damaged_copy(shards, tmp_path, _zero_image)

    def reader(**kw):
        return ShardReader(copy, "train", batch_size=4, seed=1, shuffle_buffer=6, skip_bad=True, **kw)

    ours, today = _fed(reader(decode="gpu"), workers), _batches(reader(), workers)
    assert [b.get("skipped") for b in ours] == [b.get("skipped") for b in today]
    assert any(s[2] == key for b in ours for s in b.get("skipped", []))
    _same_tensors(ours, today)


def test_reused_float_batches_are_never_overwritten_while_held():
    pool = Reused()
    a = pool.get(torch.Size((2, 3, 4, 4)))
    a.fill_(1)
    b = pool.get(a.shape)  # a is held: new memory
    assert a.data_ptr() != b.data_ptr()
    view = b[0]
    del b
    c = pool.get(a.shape)  # a view of b is held: still new memory
    assert c.data_ptr() not in (a.data_ptr(), view.data_ptr() - 0)
    ptr = a.data_ptr()
    del a
    assert pool.get(c.shape).data_ptr() == ptr  # nobody holds a: used again


def test_reused_float_batches_come_in_the_layout_asked_for():
    pool = Reused()
    shape = torch.Size((2, 3, 4, 4))
    a = pool.get(shape, channels_last=True)
    assert a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous()
    ptr = a.data_ptr()
    del a
    b = pool.get(shape)  # an NCHW batch is not handed a channels-last buffer
    assert b.is_contiguous() and b.data_ptr() != ptr
    assert pool.get(shape, channels_last=True).data_ptr() == ptr


def test_workers_decode_into_ring_slots_and_take_new_memory_when_none_is_free(big_shards):  # noqa: F811
    reader = ShardReader(big_shards, "train", batch_size=4, seed=3, fields=("image",), image_size=24, normalize=False)
    loader = make_loader(reader, 2)
    ring = reader.share_ring(1)  # made before the workers fork; nobody frees a slot below
    assert ring is not None and ring.pixels.shape == (2, 1, 4, 24, 24, 3)
    reader.set_epoch(0)
    try:
        batches = list(loader)
    finally:
        close_loader(loader)
    slotted = [b for b in batches if "image_slot" in b]
    assert [tuple(b["image_slot"]) for b in slotted] == [(0, 0), (1, 0)]  # each worker's one slot, once
    assert all(b["image"].dtype == torch.uint8 for b in batches if "image_slot" not in b) and len(batches) > 2
    assert ShardReader(big_shards, batch_size=4).share_ring(2) is None  # float batches, or no workers: no ring


# -- the GPU feed's thread (`ahead`), and `DeviceFeed._ahead` over stand-ins for CUDA's streams ----


def _feed_threads():
    return [t for t in threading.enumerate() if t.name == "pipe-device-feed"]


def _until(condition, seconds: float = 10.0) -> None:
    """Wait for ``condition()`` (a thread's progress), failing after ``seconds``: no fixed sleep
    that a loaded machine could outrun."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the feed's thread made no progress"
        time.sleep(0.005)


def test_ahead_places_in_order_one_item_ahead_of_the_caller():
    placed = []

    def place(i):
        placed.append(i)
        return i * 10

    got = ahead(iter(range(5)), place)
    assert next(got) == 0
    _until(lambda: len(placed) == 2)  # the caller computes on item 0: item 1 is placed meanwhile,
    time.sleep(0.1)
    assert placed == [0, 1]  # item 2 is not
    assert list(got) == [10, 20, 30, 40] and placed == [0, 1, 2, 3, 4]
    assert not _feed_threads()


@pytest.mark.parametrize("where", ["items", "place"])
def test_ahead_raises_an_error_after_the_items_before_it(where):
    def items():
        yield from (0, 1)
        if where == "items":
            raise ValueError("bad shard")
        yield 2
        yield 3

    def place(i):
        if where == "place" and i == 2:
            raise ValueError("bad jpeg")
        return i

    got = []
    with pytest.raises(ValueError, match="bad"):
        for x in ahead(items(), place):
            got.append(x)
    assert got == [0, 1] and not _feed_threads()


def test_closing_ahead_stops_its_thread_and_leaves_the_rest_of_the_items():
    items, placed = iter(range(10)), []
    got = ahead(items, lambda i: placed.append(i) or i)
    assert next(got) == 0
    _until(lambda: len(placed) == 2)  # the thread places item 1 meanwhile
    got.close()  # as the loop does at --max-steps: nobody touches the loader's iterator after this
    assert not _feed_threads()
    assert next(items) == 2  # item 1 was placed ahead (and dropped), nothing further was taken


def test_closing_ahead_on_a_stuck_loader_says_so():
    release, reading = threading.Event(), threading.Event()

    def items():
        yield 0
        reading.set()
        release.wait(30)  # a read that does not return
        yield 1

    got = ahead(items(), lambda i: i, join_s=0.2)
    assert next(got) == 0
    _until(reading.is_set)  # the thread is in the read
    with pytest.raises(RuntimeError, match="stuck"):
        got.close()
    release.set()
    for t in _feed_threads():  # it ends once its read returns
        t.join(5)
    assert not _feed_threads()


def test_the_gpu_feed_waits_for_each_batchs_own_event_before_it_is_used(monkeypatch):
    """`DeviceFeed._ahead` with stand-ins for torch.cuda's stream, event and device: each batch is
    placed under the side stream on the feed's thread, and the step's stream waits for the event
    recorded after that batch's work before the batch reaches the caller."""
    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, event):
            log.append(("wait", event.batch))

    side, step = Stream("side"), Stream("step")

    class Event:
        def record(self, stream):
            assert stream is side
            self.batch = placing[-1]
            log.append(("record", self.batch))

    class Context:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "device", Context)
    monkeypatch.setattr(torch.cuda, "stream", Context)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: step)
    placing = []

    def place(batch):
        assert threading.current_thread().name == "pipe-device-feed"
        placing.append(batch["n"])
        log.append(("place", batch["n"]))
        return {"n": batch["n"], "label": torch.tensor([batch["n"]])}  # CPU tensors: no record_stream

    feed = DeviceFeed.__new__(DeviceFeed)
    feed.loader, feed.device, feed.place = [{"n": i} for i in range(3)], torch.device("cuda", 0), place
    for b in feed._ahead():
        log.append(("use", b["n"]))
    for n in range(3):
        assert log.index(("place", n)) < log.index(("record", n)) < log.index(("wait", n)) < log.index(("use", n))
    assert log.index(("use", 0)) < log.index(("place", 2))  # one batch ahead, no more
    assert not _feed_threads()


def test_a_batch_is_all_encoded_only_when_every_slot_has_a_jpeg_to_decode():
    from train.data.device import _all_encoded

    assert _all_encoded({"jpeg_offsets": torch.tensor([0, 5, 9, 20])})
    assert not _all_encoded({"jpeg_offsets": torch.tensor([0, 5, 5, 20])})  # slot 1 decoded by its worker (a PNG)
    assert not _all_encoded({"jpeg_offsets": torch.tensor([0])}) and not _all_encoded({"image": None})
