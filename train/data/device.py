"""Batches onto the device: pinned, copied ``non_blocking`` one step ahead, normalised there a whole
batch at once, and (``--decode gpu``) their JPEGs decoded there.

The dataloader workers ship images as uint8 (`train.data.reader.ShardReader` with
``normalize=False``): a quarter of float32's bytes to move through shared memory, pin and copy,
and no float per pixel in the worker. `DeviceFeed` wraps the loader: on a GPU, a thread of its own
takes batch k+1 from the loader, pins it and copies it on a side stream, decodes its JPEGs there
when the workers left them undecoded, and normalises the whole batch in one pass (``x * scale +
shift`` in float32, the very operations the workers apply to one image on the CPU path, so the
model is fed the same tensors), all while the model computes on batch k. The thread matters: the
training step waits for the GPU at its end (every rank's loss is checked), so host work done
between steps (fetching from the loader, the pinning copy, nvJPEG's host-side Huffman decoding)
would leave the GPU idle; on the thread it overlaps the step, and the GIL is released in all of it
that takes time. The step's stream waits for an event recorded after each batch's work, and each
of the batch's tensors is marked in use by that stream (``record_stream``), so the side stream's
memory is not handed out again while the model still reads it. On a CPU rank there is nothing to
overlap: it decodes (the fallback) and normalises there, in the training process, into float
batches whose memory is used again (`Reused`): with the workers' uint8 that costs less CPU per
sample than float batches made fresh in the workers (bench/loader.py).

``--decode gpu`` decodes with `torchvision.io.decode_jpeg` on the GPU (nvJPEG), batched, then
resizes the batch with an antialiased bicubic filter (the CPU path's is Lanczos-3: pixels differ
slightly, samples and order do not). A JPEG the GPU will not decode, and every JPEG where there is
no GPU, is decoded by the CPU decoder (`train.data.reader.decode_at`) into the same slot: the same
samples in the same order either way (tests/train/data/test_device.py checks the fallback).
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch

from pipeline.formats.sample import DecodeError
from train.data.reader import ShardReader, decode_at
from train.data.stream import SampleDecodeError

ENCODED = ("jpeg", "jpeg_offsets")  # a batch's undecoded JPEGs (`train.data.reader._Images.fields`)
JOIN_S = 120.0  # how long closing the feed waits for its thread's batch in progress (a loader's next batch)

T = TypeVar("T")
U = TypeVar("U")


def normalize_batch(image: torch.Tensor, has: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """A uint8 [B,3,S,S] batch (any memory layout) as float32 ``x * scale + shift`` (scale and
    shift [1,3,1,1]), into ``out`` when given; slots without an image (``has`` False) are zeros, the
    mean colour, as the workers leave them. NCHW, or in ``out``'s layout: a channels-last ``out`` (a
    model that runs channels-last, `train.components.wrapping.Placement`) gets the same values in
    channels-last memory, so the model's input needs no transpose. On a GPU: one conversion pass and two in-place passes
    over the batch, no host sync. On a CPU the same operations an image at a time, each image's
    passes in cache (measured: 0.10 ms a sample against 0.14 for whole-batch passes); channels-last
    from the workers' interleaved pixels, each pass is straight (no gather of every third byte):
    0.05 ms a sample against 0.085 NCHW, bit for bit the same floats."""
    if out is None:
        out = torch.empty(image.shape, dtype=torch.float32, device=image.device)
    scale, shift = scale.to(image.device, non_blocking=True), shift.to(image.device, non_blocking=True)
    if out.device.type == "cpu" and _interleaved(out) and _interleaved(image):
        _normalize_rows(image, scale, shift, out)
    elif out.device.type == "cpu":  # an image at a time: its three passes stay in cache
        per_image = scale[0], shift[0]  # made once a batch, not twice an image (~0.005 ms a sample)
        for x, u in zip(out, image):
            x.copy_(u)
            x.mul_(per_image[0]).add_(per_image[1])
    else:
        out.copy_(image)
        out.mul_(scale).add_(shift)
    if has is None:
        return out
    if out.device.type == "cpu":  # a pass over the batch only where a slot has no image
        if not bool(has.all()):
            out[~has.cpu()] = 0.0
    else:  # no host sync on a GPU: one masked pass
        out.masked_fill_(~has.to(image.device, non_blocking=True).view(-1, 1, 1, 1), 0.0)
    return out


def _interleaved(x: torch.Tensor) -> bool:
    """Whether [B,3,S,S] ``x`` is channels-last in memory with its images packed: each image's pixels
    one run of S*S*3 values, R, G, B interleaved (a [B,S,S,3] array seen as [B,3,S,S])."""
    b, c, h, w = x.shape
    return c == 3 and x.stride()[1:] == (1, w * c, c)


def _normalize_rows(image: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> None:
    """`normalize_batch` on a CPU, both tensors interleaved (`_interleaved`): each image as rows of S
    pixels ([S, 3S]) normalised by a row-long repeat of the three channels' scale and shift, an image
    at a time (its passes in cache). Each value gets the very operations of the NCHW path."""
    b, _, h, w = image.shape
    rows_in = image.permute(0, 2, 3, 1).view(b, h, w * 3)  # views of the same memory (`_interleaved`)
    rows_out = out.permute(0, 2, 3, 1).view(b, h, w * 3)
    row_scale, row_shift = scale.reshape(3).repeat(w), shift.reshape(3).repeat(w)
    for x, u in zip(rows_out, rows_in):
        x.copy_(u)
        x.mul_(row_scale).add_(row_shift)


def decode_batch(image: torch.Tensor, data: torch.Tensor, offsets: torch.Tensor, stored: int, keys: list[str],
                 gpu: bool) -> bool:
    """Decode the JPEGs in ``data`` (slot i's bytes ``data[offsets[i]:offsets[i+1]]``, empty where
    the slot is done) into the uint8 [B,3,S,S] ``image`` (on the device), resized from ``stored``
    px. ``gpu``: nvJPEG first; what it refuses, and everything without it, through the CPU decoder.
    False when nvJPEG refused every JPEG of the batch (a torchvision without it, say)."""
    bounds = offsets.tolist()
    slots = [i for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]
    if not slots:
        return True
    left = _decode_gpu(image, data, bounds, slots) if gpu else slots
    size = image.shape[-1]
    raw = data.numpy()
    for i in left:
        try:
            arr = decode_at(raw[bounds[i]:bounds[i + 1]].tobytes(), "jpg", stored, size)
        except DecodeError as e:  # its header passed the worker's checks; the rest of it is damaged
            raise SampleDecodeError(f"sample {keys[i]}: {e}") from None
        image[i].copy_(torch.from_numpy(arr).permute(2, 0, 1), non_blocking=False)
    return not gpu or len(left) < len(slots)


def _decode_gpu(image: torch.Tensor, data: torch.Tensor, bounds: list[int], slots: list[int]) -> list[int]:
    """nvJPEG over the slots, a batch at a time; the slots it could not decode, for the CPU."""
    import torch.nn.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg

    parts = [data[bounds[i]:bounds[i + 1]] for i in slots]
    decoded: list[torch.Tensor] = []
    done: list[int] = []
    left: list[int] = []
    try:
        decoded, done = list(decode_jpeg(parts, mode=ImageReadMode.RGB, device=image.device)), slots
    except RuntimeError:  # one image nvJPEG refuses fails the batch: one at a time, the rest to the CPU
        for i, part in zip(slots, parts):
            try:
                decoded.append(decode_jpeg(part, mode=ImageReadMode.RGB, device=image.device))
                done.append(i)
            except RuntimeError:
                left.append(i)
    if done:
        x = torch.stack(decoded)
        size = image.shape[-1]
        if x.shape[-1] != size or x.shape[-2] != size:
            x = F.interpolate(x.float(), size=(size, size), mode="bicubic", antialias=True)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        image[torch.tensor(done, device=image.device)] = x
    return left


class Reused:
    """Float batches in host memory that is used again once nobody holds the last batch in it.

    A new 38 MB tensor per batch (64 x 3 x 224 x 224) costs more in page faults than normalising
    it (measured: 0.38 ms a sample fresh, 0.10 reused); the training loop lets go of a batch one
    step later, so two or three buffers go round. A buffer is reused only when no tensor or view
    outside this pool refers to its memory (its storage's use count), so a caller that keeps a
    batch keeps it intact; without that count (another torch) every batch is new."""

    KEEP = 4

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.count = getattr(torch._C, "_storage_Use_Count", None)

    def get(self, shape: torch.Size, channels_last: bool = False) -> torch.Tensor:
        """A float32 batch of ``shape``, NCHW or (``channels_last``) channels-last in memory."""
        layout = torch.channels_last if channels_last else torch.contiguous_format
        if self.count is not None:
            for buf in self.buffers:
                # one reference from this list's tensor, one from the storage object asked for here
                if buf.shape == shape and buf.is_contiguous(memory_format=layout) \
                        and self.count(buf.untyped_storage()._cdata) <= 2:
                    return buf.view(shape)  # a tensor of its own (same strides): while it is held, the count says so
        buf = torch.empty(shape, dtype=torch.float32, memory_format=layout)  # (made in that layout: no copy)
        if self.count is not None:
            self.buffers = [*self.buffers[-(self.KEEP - 1):], buf]
        return buf.view(shape)


def _all_encoded(batch: dict) -> bool:
    """Whether every slot of ``batch`` holds a JPEG left to decode (none decoded by a worker, none empty)."""
    offsets = batch.get("jpeg_offsets")
    return offsets is not None and len(offsets) > 1 and bool((offsets[1:] > offsets[:-1]).all())


def ahead(items: Iterator[T], place: Callable[[T], U], join_s: float = JOIN_S) -> Iterator[U]:
    """``place(item)`` of each of ``items``, in order, done on a thread of its own one item ahead:
    item k+1 is taken and placed while the caller uses item k, and no further (one placed item
    waits at most). An error, of ``items`` or of ``place``, is raised where it came, after the
    items before it. Closing this generator stops the thread and waits (``join_s`` at most) for
    the item it was at, so nobody else touches ``items`` once it returns."""
    ready: queue.Queue = queue.Queue()
    room = threading.Semaphore(1)  # the one item that may be placed before the caller takes it
    stop = threading.Event()

    def fill() -> None:
        try:
            while True:
                while not room.acquire(timeout=0.05):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                try:
                    item = next(items)
                except StopIteration:
                    ready.put(("end", None))
                    return
                ready.put(("item", place(item)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there in order
            ready.put(("error", e))

    thread = threading.Thread(target=fill, name="pipe-device-feed", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            room.release()  # the next item, placed while the caller uses this one
            yield value
    finally:
        stop.set()
        thread.join(join_s)
        if thread.is_alive():
            raise RuntimeError(f"the device feed's thread did not finish its batch within {join_s:.0f} s of the "
                               "feed's end: its loader is stuck")


class DeviceFeed:
    """The loader's batches on ``device``, images decoded and normalised there (see the module).

    ``reader``: the loader's `train.data.reader.ShardReader` (its normalisation for uint8 images,
    its stored image size for JPEGs left to decode, ``decode``); made before the loader's workers
    start, the feed shares a ring of batch slots with them (`ShardReader.share_ring`). Iterating it
    iterates the loader once. ``channels_last``: the model runs channels-last
    (`train.components.wrapping.Placement`): on a CPU, images are normalised straight into
    channels-last float batches (`normalize_batch`), which the model's input then is as it stands,
    instead of NCHW ones transposed again for it (`train.components.device.to_device`: ~0.26 ms a
    224 px sample). The same values either way.
    """

    REFUSED = 2  # batches in a row of which nvJPEG decoded nothing, after which the CPU decodes them all

    def __init__(self, loader: Iterable[dict], device: torch.device, reader: ShardReader, channels_last: bool = False):
        if device.type == "cuda" and device.index is None:  # the feed's thread must not fall back to GPU 0
            device = torch.device("cuda", torch.cuda.current_device())
        self.loader, self.device, self.stored = loader, device, reader.stored_size
        self.refused = 0
        self.gpu_decode = reader.decode == "gpu" and device.type == "cuda"
        if self.gpu_decode:
            try:
                from torchvision.io import decode_jpeg  # noqa: F401 - here, not at the first batch
            except ImportError as e:
                raise RuntimeError(f"--decode gpu needs torchvision (nvJPEG), and it does not import: {e}") from None
        scale, shift = reader.normalization()
        self.normalization = None if reader.normalize else (scale.to(device), shift.to(device))
        self.reused = Reused() if device.type == "cpu" else None  # the GPU's caching allocator does this there
        self.channels_last = channels_last and device.type == "cpu"  # a GPU's batches: as they were (NCHW)
        # a slot per batch a worker may have in flight (prefetch_factor), and one it decodes into
        self.ring = reader.share_ring((getattr(loader, "prefetch_factor", None) or 2) + 1)

    def __iter__(self) -> Iterator[dict]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self.place(batch)
            return
        yield from self._ahead()

    def _ahead(self) -> Iterator[dict]:
        """Batch k+1 fetched, copied, decoded and normalised on a thread and a side stream while
        batch k is used (`ahead`); an error is raised where the unprefetched loop would raise it,
        after the batches before it."""
        stream = torch.cuda.Stream(self.device)
        it = iter(self.loader)  # here: a DataLoader's iterator sets its signal handlers in the main thread

        def place(batch: dict) -> tuple[dict, torch.cuda.Event]:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):  # the thread's own current stream
                out = self.place(batch)
                done = torch.cuda.Event()
                done.record(stream)  # this batch's work, not the next one's that the thread starts later
            return out, done

        for out, done in ahead(it, place):
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            for v in out.values():
                if isinstance(v, torch.Tensor) and v.device.type == "cuda":
                    v.record_stream(current)  # made on the side stream: not reused while the step reads it
            yield out

    def place(self, batch: dict) -> dict:
        """One batch: tensors onto the device (``non_blocking``: from pinned memory the copy is
        asynchronous), its images out of their ring slot, JPEGs decoded into ``image``, uint8
        images normalised; the slot freed for its worker once nothing reads it any more."""
        slot = batch.get("image_slot")
        out = {k: (v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
               for k, v in batch.items() if k not in ENCODED and k != "image_slot"}
        if slot is None:
            return self._images(batch, out)
        if self.ring is None:
            raise RuntimeError("internal: a batch in a ring slot, but this feed shares no ring")
        slot = (int(slot[0]), int(slot[1]))
        try:
            images = self.ring.images(slot)
            if self.device.type != "cuda":  # on a CPU read where it is
                out["image"] = images
            elif _all_encoded(batch):  # --decode gpu, every slot a JPEG decoded on the device: nothing to copy
                out["image"] = torch.empty_strided(images.shape, images.stride(), dtype=torch.uint8, device=self.device)
            else:  # through pinned memory (torch's caching host allocator: no new pages, and a block is
                out["image"] = images.pin_memory().to(self.device, non_blocking=True)  # not reused before its copy)
            return self._images(batch, out)
        finally:
            self.ring.free(slot)

    def _images(self, batch: dict, out: dict) -> dict:
        if "jpeg" in batch:
            if decode_batch(out["image"], batch["jpeg"], batch["jpeg_offsets"], int(self.stored or 0),
                            list(batch.get("key") or []), self.gpu_decode):
                self.refused = 0
            else:  # nvJPEG took none of them: a batch call and one call per image failed, on the host
                self.refused += 1
                if self.refused == self.REFUSED:
                    self.gpu_decode = False
                    warnings.warn(f"--decode gpu: nvJPEG refused every JPEG of {self.REFUSED} batches in a row; the "
                                  "CPU decoder decodes them from now on, in the training process", RuntimeWarning,
                                  stacklevel=2)
        image = out.get("image")
        if self.normalization is not None and isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
            into = self.reused.get(image.shape, self.channels_last) if self.reused is not None else None
            scale, shift = self.normalization
            out["image"] = normalize_batch(image, out.get("has_image"), scale, shift, out=into)
        return out

