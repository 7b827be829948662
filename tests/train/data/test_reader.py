"""The streaming reader under a real DataLoader: it yields exactly what the plan says (so the
plan's property tests cover it), the epoch reaches persistent and fresh workers, resume is
exact, tensors are what the API promises, and a broken sample names its shard and key."""

import tarfile

import numpy as np
import pytest
import torch

from pipeline.formats.sample import decode_image
from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir, simple_specs
from train.data.plan import block_key, rank_stream
from train.data.reader import SampleDecodeError, ShardReader, close_loader, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    specs = simple_specs(61, classes=3, text_every=3) + [Spec("blank", "c1", image=False, text="only text")]
    make_clean_dir(root / "clean", specs)
    stage.run(stage.ShardConfig(root / "clean", root / "shards", max_count=9, max_size=20_000, val_fraction=0.2),
              show_progress=False)
    return root / "shards"


def keys_by_position(shard_dir, split):
    """(shard number, index) -> key, read with Python's tarfile (independent of our parser)."""
    import json

    index = json.loads((shard_dir / "index.json").read_text())
    out = {}
    for n, sh in enumerate(s for s in index["shards"] if s["split"] == split):
        with tarfile.open(shard_dir / sh["name"]) as tf:
            keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m in tf.getmembers()))
        out.update({(n, i): k for i, k in enumerate(keys)})
    return out


def expected_keys(reader, epoch, workers, consumed=0, split="train"):
    names = keys_by_position(reader.shard_dir, split)
    block = reader.shuffle_buffer if split == "train" else 0
    plan = reader.plan(epoch)
    key = block_key(reader.seed, epoch, reader.rank, plan.generation)
    stream = rank_stream(plan, reader.rank, workers, block, key, consumed - reader._earlier(reader.history(epoch)))
    return [names[(s, i)] for s, i, _ in stream]


def loader_keys(loader):
    return [k for batch in loader for k in batch["key"]]


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True), (3, True)])
def test_loader_yields_the_planned_keys_every_epoch(shards, workers, persistent):
    readers = [ShardReader(shards, "train", rank, 2, batch_size=3, seed=5, shuffle_buffer=4) for rank in range(2)]
    loaders = [make_loader(r, workers, persistent_workers=persistent) for r in readers]
    try:
        for epoch in range(2):
            seen = []
            for r, loader in zip(readers, loaders):
                r.set_epoch(epoch)
                got = loader_keys(loader)
                assert got == expected_keys(r, epoch, workers)
                assert len(got) == r.steps_per_epoch * 3
                seen += got
            assert len(seen) == len(set(seen))
    finally:
        for loader in loaders:
            close_loader(loader)


@pytest.mark.parametrize("workers", [0, 3])
def test_resume_mid_epoch_continues_exactly(shards, workers):
    reader = ShardReader(shards, "train", 1, 2, batch_size=2, seed=1, shuffle_buffer=5)
    loader = make_loader(reader, workers, persistent_workers=True)
    try:
        reader.set_epoch(4)
        full = loader_keys(loader)
        for steps_done in (1, 5, reader.steps_per_epoch - 1):
            reader.set_epoch(4, consumed=steps_done * 2)
            assert loader_keys(loader) == full[steps_done * 2 :]
    finally:
        close_loader(loader)


def test_resume_position_must_be_whole_batches(shards):
    reader = ShardReader(shards, batch_size=4)
    with pytest.raises(ValueError, match="whole number of batches"):
        reader.set_epoch(0, consumed=6)


def test_batch_tensors(shards):
    reader = ShardReader(shards, "train", batch_size=8, max_text_len=6)
    batch = next(iter(make_loader(reader, 0)))
    s = reader.image_size
    assert batch["image"].shape == (8, 3, s, s) and batch["image"].dtype == torch.float32
    assert batch["text"].shape == (8, 6) and batch["text"].dtype == torch.int64
    assert batch["label"].dtype == torch.int64 and batch["text_len"].dtype == torch.int64
    assert batch["valid"].all() and reader.num_classes == 3
    # the first sample, decoded by hand and normalized with index.json's numbers
    key = batch["key"][0]
    raw = _member(shards, key, ".jpg")
    want = (torch.from_numpy(decode_image(raw, "jpg")).permute(2, 0, 1).float() / 255 - torch.tensor(reader.index["mean"]).view(3, 1, 1)) \
        / torch.tensor(reader.index["std"]).view(3, 1, 1)
    assert torch.allclose(batch["image"][0], want, atol=1e-5)
    for i, k in enumerate(batch["key"]):
        text = _member(shards, k, ".txt")
        ids = [b + 1 for b in (text or b"")[:6]]
        assert batch["text"][i, : len(ids)].tolist() == ids and batch["text_len"][i] == len(ids)
        assert int(_member(shards, k, ".cls")) == batch["label"][i]


def test_small_tensors_shipped_by_value_from_workers_arrive_as_the_same_tensors(shards, monkeypatch):
    """Labels, masks and lengths travel pickled from a worker (no shared-memory segment each) and
    come out as the tensors shipping them as tensors gives: same dtypes and values, writable."""
    import train.data.reader as reader_module

    batches = {}
    for by_value in (False, True):
        if not by_value:
            monkeypatch.setattr(reader_module, "_by_value", lambda batch: batch)  # the workers fork with this
        reader = ShardReader(shards, "train", batch_size=8, max_text_len=6, normalize=False)
        loader = make_loader(reader, 2)
        reader.set_epoch(0)
        batches[by_value] = list(loader)
        close_loader(loader)
        monkeypatch.undo()
    assert len(batches[True]) == len(batches[False]) > 0
    for got, want in zip(batches[True], batches[False]):
        assert got.keys() == want.keys() and got["key"] == want["key"]
        for name, v in want.items():
            if isinstance(v, torch.Tensor):
                assert isinstance(got[name], torch.Tensor) and got[name].dtype == v.dtype and torch.equal(got[name], v), name
        got["label"] += 0  # writable, as before
        # pickled, not a shared-memory segment each (the DataLoader's default_convert would make them tensors again)
        assert want["label"].is_shared() and not any(got[k].is_shared() for k in ("label", "valid", "text", "text_len"))
    made = next(iter(make_loader(ShardReader(shards, "train", batch_size=8, max_text_len=6, normalize=False), 0)))
    shipped = reader_module._by_value(made)  # what a worker pickles: the small tensors as arrays
    assert {"label", "valid", "has_image", "text", "text_len"} <= {k for k, v in shipped.items() if isinstance(v, np.ndarray)}
    shared, big = torch.zeros(4).share_memory_(), torch.zeros(reader_module.SMALL + 1, dtype=torch.uint8)
    assert all(v is reader_module._by_value({"x": v})["x"] for v in (shared, big))  # already shared, or large: as it was


def test_train_images_normalize_to_zero_mean_unit_std(shards):
    reader = ShardReader(shards, "train", batch_size=1, fields=("image",))
    images = torch.cat([b["image"][b["has_image"]] for b in make_loader(reader, 0)])
    # every train image but the (at most world x batch - 1 = 0) left out: exactly the index's pixels
    assert torch.allclose(images.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(images.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)


def test_sample_without_image_gets_mean_colour_and_flag(shards):
    split = "val" if "blank" in keys_by_position(shards, "val").values() else "train"
    for batch in make_loader(ShardReader(shards, split, batch_size=1), 0):
        if batch["key"][0] == "blank":
            assert not batch["has_image"][0] and batch["image"].abs().max() == 0
            assert batch["text_len"][0] == len(b"only text")
            return
    pytest.fail("the text-only sample was not read")


def test_validation_reads_every_sample_once_on_equal_steps(shards):
    names = set(keys_by_position(shards, "val").values())
    readers = [ShardReader(shards, "val", r, 3, batch_size=4) for r in range(3)]
    valid, steps = [], set()
    for r in readers:
        batches = list(make_loader(r, 2))
        steps.add(len(batches))
        valid += [k for b in batches for k, ok in zip(b["key"], b["valid"].tolist()) if ok]
    assert len(steps) == 1 and sorted(valid) == sorted(names)


def test_undecodable_sample_names_shard_and_key(tmp_path):
    specs = simple_specs(12, classes=2, text_every=0, size=64)
    make_clean_dir(tmp_path / "clean", specs)
    stage.run(stage.ShardConfig(tmp_path / "clean", tmp_path / "shards", val_fraction=0), show_progress=False)
    tar_path = tmp_path / "shards" / "train-000000.tar"
    with tarfile.open(tar_path) as tf:
        victim = next(m for m in tf.getmembers() if m.name.endswith(".jpg"))
    data = bytearray(tar_path.read_bytes())
    mid = victim.offset_data + victim.size // 2
    data[mid : victim.offset_data + victim.size - 2] = bytes(victim.offset_data + victim.size - 2 - mid)  # same size, garbage
    tar_path.write_bytes(bytes(data))
    reader = ShardReader(tmp_path / "shards", batch_size=2)
    key = victim.name.split(".")[0]
    it = iter(make_loader(reader, 2))
    try:
        with pytest.raises(SampleDecodeError, match=rf"^train-000000\.tar: sample {key} ") as caught:
            for _ in it:
                pass
        assert "\n" not in str(caught.value)  # one line, not the worker's traceback
    finally:
        it._shutdown_workers()


def test_changed_shard_is_reported_not_misread(tmp_path):
    make_clean_dir(tmp_path / "clean", simple_specs(8, classes=2))
    stage.run(stage.ShardConfig(tmp_path / "clean", tmp_path / "shards", val_fraction=0), show_progress=False)
    tar_path = tmp_path / "shards" / "train-000000.tar"
    tar_path.write_bytes(tar_path.read_bytes()[:-3000])
    with pytest.raises(SampleDecodeError, match="train-000000.tar"):
        list(make_loader(ShardReader(tmp_path / "shards", batch_size=2), 0))


def test_bad_arguments_are_clear(shards):
    with pytest.raises(ValueError, match="cannot fill one step"):
        ShardReader(shards, "train", 0, 8, batch_size=100)
    with pytest.raises(ValueError, match="unknown fields"):
        ShardReader(shards, fields=("image", "audio"))
    with pytest.raises(ValueError, match="outside world size"):
        ShardReader(shards, rank=2, world_size=2)


def _member(shard_dir, key, ext):
    for tar in sorted(shard_dir.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name == key + ext:
                    return tf.extractfile(m).read()
    return None


def test_stock_webdataset_reads_every_indexed_sample(shards):
    import json

    import webdataset as wds

    index = json.loads((shards / "index.json").read_text())
    urls = [str(shards / s["name"]) for s in index["shards"]]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8"))
    assert len(samples) == sum(s["count"] for s in index["shards"])
    assert len({s["__key__"] for s in samples}) == len(samples)
    size = index["image_size"]
    for s in samples:
        assert isinstance(s["cls"], int) and 0 <= s["cls"] < len(index["classes"])
        assert s["json"]["label"] == index["classes"][s["cls"]]
        if "jpg" in s:
            assert np.asarray(s["jpg"]).shape == (size, size, 3)


def test_state_dict_round_trip_and_refusals(shards):
    reader = ShardReader(shards, "train", 0, 2, batch_size=2, seed=3)
    loader = make_loader(reader, 2)
    reader.set_epoch(2)
    full = loader_keys(loader)
    state = reader.state_dict(steps_done=4)
    again = ShardReader(shards, "train", 0, 2, batch_size=2, seed=3)
    resumed = make_loader(again, 2)
    again.load_state_dict(state)
    assert again.epoch == 2 and loader_keys(resumed) == full[8:]
    other = ShardReader(shards, "train", 0, 3, batch_size=2, seed=3)
    make_loader(other, 2)
    with pytest.raises(ValueError, match="world_size 2 -> 3"):
        other.load_state_dict(state)
    other.load_state_dict(reader.state_dict(steps_done=reader.steps_per_epoch))  # epoch done: next one, any world
    assert other.epoch == 3


# -- images at the model's size (decoded smaller in the workers, not shipped at the stored size) --


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory):
    """96 px images, JPEG and PNG, so that a 24 px read takes the JPEG's DCT-domain shrink (1/2)."""
    root = tmp_path_factory.mktemp("big")
    specs = [Spec(f"b{i:03d}", f"c{i % 2}", seed=i, size=96, fmt="png" if i % 4 == 3 else "jpg") for i in range(16)]
    make_clean_dir(root / "clean", specs)
    stage.run(stage.ShardConfig(root / "clean", root / "shards", val_fraction=0), show_progress=False)
    return root / "shards"


def _reference(raw: bytes, size: int) -> np.ndarray:
    """The plain way: Pillow decodes the whole image, its LANCZOS (the same Lanczos-3) resizes it."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im.convert("RGB").resize((size, size), Image.Resampling.LANCZOS), dtype=np.float64)


@pytest.mark.parametrize("workers", [0, 2])
def test_images_come_at_the_requested_size_matching_a_full_decode(big_shards, workers):
    reader = ShardReader(big_shards, "train", batch_size=4, fields=("image",), image_size=24)
    assert reader.stored_size == 96 and reader.image_size == 24
    mean, std = np.array(reader.index["mean"]).reshape(3, 1, 1), np.array(reader.index["std"]).reshape(3, 1, 1)
    loader = make_loader(reader, workers)
    seen = set()
    try:
        for batch in loader:
            assert batch["image"].shape == (4, 3, 24, 24) and batch["image"].dtype == torch.float32
            for key, x in zip(batch["key"], batch["image"].double().numpy()):
                ext = ".png" if _member(big_shards, key, ".png") else ".jpg"
                want = _reference(_member(big_shards, key, ext), 24).transpose(2, 0, 1)
                got = (x * std + mean) * 255  # back to pixel values
                # measured: 0.5 levels on average for a JPEG (its DCT-domain half is not a full
                # decode), 0.13 for a PNG (fast_image_resize's Lanczos-3 is not bit-equal to Pillow's)
                assert np.abs(got - want).mean() < (1.0 if ext == ".jpg" else 0.3), key
                seen.add(ext)
    finally:
        close_loader(loader)
    assert seen == {".jpg", ".png"}


def test_default_image_size_is_the_stored_one_and_never_enlarged(big_shards):
    assert ShardReader(big_shards, batch_size=4).image_size == 96
    assert ShardReader(big_shards, batch_size=4, image_size=96).image_size == 96
    with pytest.raises(ValueError, match="never enlarged"):
        ShardReader(big_shards, batch_size=4, image_size=128)


def test_undecodable_sample_at_a_smaller_size_names_shard_and_key(big_shards, tmp_path):
    import shutil

    shards = tmp_path / "shards"
    shutil.copytree(big_shards, shards)
    tar_path = next(shards.glob("train-*.tar"))
    with tarfile.open(tar_path) as tf:
        victim = next(m for m in tf.getmembers() if m.name.endswith(".jpg"))
    data = bytearray(tar_path.read_bytes())
    start = victim.offset_data + victim.size // 2
    data[start : victim.offset_data + victim.size - 2] = bytes(victim.offset_data + victim.size - 2 - start)
    tar_path.write_bytes(bytes(data))
    key = victim.name.split(".")[0]
    with pytest.raises(SampleDecodeError, match=rf"^{tar_path.name}: sample {key} .*does not decode"):
        list(make_loader(ShardReader(shards, batch_size=2, image_size=24), 0))


def test_pairs_carry_caption_and_group_ids_and_no_class_reads_as_minus_one(tmp_path):
    """fields with "pairs" (issue 22): equal captions get equal ids, a near-duplicate group recorded
    in the .json one id for its pairs, a pair without a label the class -1 (without "pairs", its
    missing .cls is still an error)."""
    from train.data.pairs import NO_GROUP

    base = 0x0123456789ABCDEF
    specs = [Spec(key="a", label=None, seed=1, text="same words", phash=base),
             Spec(key="b", label=None, seed=2, text="other words", phash=base ^ 0b11),  # near copy of a
             Spec(key="c", label="cat", seed=3, text="same words", phash=0x5555_5555_5555_5555),
             Spec(key="d", label="cat", seed=4, text="alone", phash=0x00FF_00FF_00FF_00FF)]
    stage.run(stage.ShardConfig(make_clean_dir(tmp_path / "clean", specs), tmp_path / "shards", val_fraction=0.0),
              show_progress=False)
    reader = ShardReader(tmp_path / "shards", "train", batch_size=4, fields=("text", "pairs"), shuffle_buffer=0)
    reader.set_epoch(0)
    batch = next(iter(reader))
    at = {k: i for i, k in enumerate(batch["key"])}
    cap, grp, label = batch["caption_id"], batch["group_id"], batch["label"]
    assert cap[at["a"]] == cap[at["c"]] and cap[at["a"]] != cap[at["b"]] != cap[at["d"]]
    assert grp[at["a"]] == grp[at["b"]] >= 0 and grp[at["c"]] == grp[at["d"]] == NO_GROUP
    assert label[at["a"]] == label[at["b"]] == -1 and label[at["c"]] == label[at["d"]] == 0
    plain = ShardReader(tmp_path / "shards", "train", batch_size=4, fields=("text",), shuffle_buffer=0)
    plain.set_epoch(0)
    with pytest.raises(SampleDecodeError, match="no .cls member"):
        next(iter(plain))


@pytest.mark.parametrize("world,batch,workers,buffer", [(3, 2, 1, 5), (1, 6, 3, 0), (6, 1, 0, 7)])
def test_a_mid_epoch_position_continues_on_another_layout_with_every_sample_once(shards, world, batch, workers, buffer):
    """2 ranks x batch 3 (global batch 6), 2 workers, read 3 batches each into epoch 1; then the
    rest of the epoch on another world size, per-rank batch, worker count and shuffle buffer with
    the global batch kept: the two parts together are the epoch's samples, each once, and every
    new rank reads the same number of batches; the next epoch is the new layout's own."""
    before = [ShardReader(shards, "train", r, 2, batch_size=3, seed=2, shuffle_buffer=4) for r in range(2)]
    loaders = [make_loader(r, 2) for r in before]
    for r in before:
        r.set_epoch(1)
    first = [loader_keys(ld)[: 3 * 3] for ld in loaders]
    state = before[0].state_dict(steps_done=3)
    after = [ShardReader(shards, "train", r, world, batch_size=batch, seed=2, shuffle_buffer=buffer) for r in range(world)]
    rest = []
    for r in after:
        loader = make_loader(r, workers)
        r.load_state_dict(state)
        assert r.epoch == 1 and len(r.history(1)) == 1
        rest.append(loader_keys(loader))
        assert rest[-1] == expected_keys(r, 1, workers, consumed=9 * 2 // world)  # the plan's later generation
    assert len({len(k) for k in rest}) == 1
    trained = [k for keys in first + rest for k in keys]
    whole = [k for r in before for k in expected_keys(r, 1, 2)]
    assert len(trained) == len(set(trained)) and set(trained) == set(whole)
    after[0].set_epoch(2)  # the next epoch: planned for the new layout alone
    assert after[0].history(2) == () and after[0].plan(2).generation == 0


# -- bad samples mid-stream, skipped (skip_bad): named, masked, the batch kept whole ----------------


def _damaged_copy(shards, tmp_path, damage):
    """A copy of ``shards`` with ``damage(data: bytearray, members) -> key`` applied to the first
    train shard (members: its tarfile members); returns (copy, shard name, the damaged key)."""
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    target = sorted(copy.glob("train-*.tar"))[0]
    with tarfile.open(target) as tf:
        members = tf.getmembers()
    data = bytearray(target.read_bytes())
    key = damage(data, members)
    target.write_bytes(bytes(data))
    return copy, target.name, key


def _zero_image(data, members):
    victim = next(m for m in members if m.name.endswith(".jpg"))
    data[victim.offset_data : victim.offset_data + victim.size] = bytes(victim.size)  # same size, not a JPEG
    return victim.name.split(".")[0]


def _bad_caption(data, members):
    victim = next(m for m in members if m.name.endswith(".txt") and m.size >= 2)
    data[victim.offset_data : victim.offset_data + 2] = b"\xff\xfe"
    return victim.name.split(".")[0]


def _garbled_header(data, members):
    victim = next(m for m in members if m.name.endswith(".cls"))
    data[victim.offset : victim.offset + 512] = bytes(range(256)) * 2  # not a tar header any more
    return victim.name.split(".")[0]


def _all_batches(reader, workers):
    loader = make_loader(reader, workers)
    try:
        return list(loader)
    finally:
        close_loader(loader)


@pytest.mark.parametrize("damage,why", [(_zero_image, "jpg image does not decode"),
                                        (_bad_caption, "its caption is not UTF-8"),
                                        (_garbled_header, "damaged at samples")])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_sample_is_skipped_named_and_masked_and_the_batches_stay_whole(shards, tmp_path, damage, why, workers):
    copy, shard, key = _damaged_copy(shards, tmp_path, damage)
    good = ShardReader(shards, "train", 0, 1, batch_size=4, seed=1, shuffle_buffer=6)
    good.set_epoch(0)
    reader = ShardReader(copy, "train", 0, 1, batch_size=4, seed=1, shuffle_buffer=6, skip_bad=True)
    reader.set_epoch(0)
    batches = _all_batches(reader, workers)
    assert len(batches) == good.steps_per_epoch and all(len(b["key"]) == 4 for b in batches)
    skipped = [(b, entry) for b in batches for entry in b.get("skipped", [])]
    assert len(skipped) == 1
    batch, (slot, where, name, offset, reason) = skipped[0]
    assert (where, name) == (shard, key) and why in reason and offset >= 0
    assert batch["key"][slot] == key and not batch["valid"][slot] and int(batch["valid"].sum()) == 3
    donor = next(i for i in range(4) if i != slot)
    if "image" in batch:  # the slot carries a good sample of the batch: no blank image in BatchNorm's statistics
        assert any(torch.equal(batch["image"][slot], batch["image"][i]) for i in range(4) if i != slot)
    assert batch["label"][slot] in batch["label"][[i for i in range(4) if i != slot]] or donor is None
    assert [k for b in batches for k in b["key"]] == expected_keys(good, 0, workers)  # the same samples, in order
    strict = ShardReader(copy, "train", 0, 1, batch_size=4, seed=1, shuffle_buffer=6)
    if damage is _bad_caption:  # without skip_bad the bytes are fed as they are, as they always were
        assert len(_all_batches(strict, workers)) == len(batches)
        return
    with pytest.raises(SampleDecodeError, match=rf"^{shard}: "):  # without skip_bad: the one-line failure
        _all_batches(strict, workers)


def test_a_shard_cut_short_skips_the_samples_past_its_end(shards, tmp_path):
    import json

    def cut(data, members):
        del data[len(data) // 2:]
        return ""

    copy, shard, _ = _damaged_copy(shards, tmp_path, cut)
    entry = next(s for s in json.loads((copy / "index.json").read_text())["shards"] if s["name"] == shard)
    lost = sum(1 for o in entry["offsets"] if o + 512 > entry["bytes"] // 2)  # samples not wholly before the cut
    reader = ShardReader(copy, "train", 0, 1, batch_size=4, seed=1, shuffle_buffer=0, skip_bad=True)
    reader.set_epoch(0)
    batches = _all_batches(reader, 0)
    skipped = [e for b in batches for e in b.get("skipped", [])]
    assert {e[1] for e in skipped} == {shard} and lost <= len(skipped) <= lost + 1
    assert all("cut short" in e[4] or "damaged" in e[4] for e in skipped)
    assert sum(int((~b["valid"]).sum()) for b in batches) == len(skipped)


def test_a_second_resume_in_the_new_layout_continues_it_exactly_and_a_third_layout_too(shards):
    """2 ranks x batch 3, 3 batches read; on 3 ranks x batch 2 one more global batch; saved again
    and resumed in that same layout (exactly where it was), then on 1 rank x batch 6 for the rest:
    the epoch's samples once over the three generations."""
    def readers(world, batch, workers=1):
        out = [ShardReader(shards, "train", r, world, batch_size=batch, seed=4, shuffle_buffer=5) for r in range(world)]
        return out, [make_loader(r, workers) for r in out]

    first, loaders = readers(2, 3)
    for r in first:
        r.set_epoch(0)
    trained = [k for ld in loaders for k in loader_keys(ld)[:9]]
    whole = [k for r in first for k in expected_keys(r, 0, 1)]
    second, loaders = readers(3, 2)
    for r in second:
        r.load_state_dict(first[0].state_dict(steps_done=3))
    second_keys = [loader_keys(ld) for ld in loaders]
    trained += [k for keys in second_keys for k in keys[:2]]  # one more global batch: 1 batch of 2 per rank
    state = second[0].state_dict(steps_done=4)  # the epoch so far (4 global batches) in this layout's batches
    assert state["consumed"] == 24 // 3 and len(state["history"]) == 1
    again, loaders = readers(3, 2)
    for r, ld, before in zip(again, loaders, second_keys):
        r.load_state_dict(state)
        assert loader_keys(ld) == before[2:]  # the same layout: exactly where it was
    third, loaders = readers(1, 6, workers=2)
    third[0].load_state_dict(state)
    assert len(third[0].history(0)) == 2
    trained += loader_keys(loaders[0])
    assert len(trained) == len(set(trained)) and set(trained) == set(whole)
