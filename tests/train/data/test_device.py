"""Batches onto the device: uint8 batches normalised a whole batch at once give the float tensors the
workers give today; JPEGs left for the device to decode (--decode gpu) come back, through the CPU
fallback, as the same samples in the same order with the same pixels. (The GPU side itself, nvJPEG
and the prefetch stream, runs in bench/gpu_check.sh.)"""

import pytest
import torch

from tests.train.data.test_reader import _damaged_copy, big_shards, shards  # noqa: F401 - fixtures
from train.data.device import DeviceFeed, Reused, normalize_batch
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


def _fed(reader, workers):
    """The feed's batches (CPU: JPEGs left to the device are decoded by the CPU fallback)."""
    reader.set_epoch(0)
    loader = make_loader(reader, workers)
    try:
        return list(DeviceFeed(loader, CPU, reader))
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
def test_gpu_decode_falls_back_to_the_cpu_decoder_with_the_same_samples_in_order(big_shards, workers, size):  # noqa: F811
    def reader(**kw):
        return ShardReader(big_shards, "train", batch_size=4, seed=7, fields=("image",), image_size=size, **kw)

    left = _batches(reader(decode="gpu"), workers)
    assert all(b["jpeg_offsets"].shape == (5,) for b in left)
    assert sum(int(b["jpeg_offsets"][-1]) for b in left) > 0  # JPEGs were left undecoded (PNGs were not)
    # no GPU here: the feed decodes them with the CPU decoder, into the same slots
    _same_tensors(_fed(reader(decode="gpu"), workers), _batches(reader(), workers))


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
