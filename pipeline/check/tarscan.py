"""Read one shard once: its sha256 and size, and what every sample in it holds.

The tar is streamed with Python's `tarfile` (any tar a user made, not only ours), through a
reader that hashes every byte on the way, so checksum, counts, offsets and per-sample content
are all found in a single sequential pass. Members are grouped into samples the way webdataset
does it: consecutive members whose names share a key, by the sample format's one rule
(`pipeline.formats.sample.split_name`).

A worker process scans a shard and returns a compact `ShardScan` (per-sample keys, classes and
hashes; offenders as strings by the check they break), never the samples themselves.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import BinaryIO

from pipeline.check.content import inspect_image, text_problem
from pipeline.core.errors import UsageError
from pipeline.formats.sample import IMAGE_LIKE, MEMBER_ORDER, TEXT_LIKE, is_safe_key, split_name
from pipeline.storage import Folder


@dataclass(frozen=True)
class ScanSettings:
    deep: bool
    image_size: int | None
    image_mode: str
    classes: tuple[str, ...]


@dataclass
class ShardScan:
    name: str
    found: bool = True
    bytes: int = 0
    sha256: str = ""
    offsets: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    cls: list[int | None] = field(default_factory=list)
    image_hash: list[int | None] = field(default_factory=list)
    """Perceptual hash of each sample's image (None: no image, or it did not decode)."""
    exact: list[str | None] = field(default_factory=list)
    """Exact-content key of each sample: its image (pixels when deep, bytes otherwise), else its text."""
    text_sig: list[builtins.bytes | None] = field(default_factory=list)  # builtins: the field `bytes` hides the type
    """MinHash of the text of samples without an image (captions follow their image)."""
    offenders: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """check name -> "shard:key: why" for each sample that breaks it."""
    checked: Counter = field(default_factory=Counter)
    """What was looked at: images, texts, decoded (images decoded, fully or at reduced scale)."""
    error: str | None = None
    """The tar could not be read to its end (after len(keys) samples)."""
    stopped_early: str | None = None
    """Non-zero bytes lie after where tar readers stopped (a damaged header ends them quietly)."""

    @property
    def count(self) -> int:
        return len(self.keys)


class _HashingReader:
    """A file wrapper that feeds every byte read to sha256 and counts them."""

    def __init__(self, f: BinaryIO):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        b = self.f.read(size)
        self.h.update(b)
        self.n += len(b)
        return b

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def scan_shard(job: tuple[Folder, str, ScanSettings]) -> ShardScan:
    """One shard streamed from its folder once (memory bounded by a member, whatever its size):
    hashed, counted, and its samples read."""
    folder, name, s = job
    scan = ShardScan(name)
    try:
        if not folder.contained(name):
            raise FileNotFoundError(name)  # a name leaving the folder names no shard of it
        f = folder.open(name)
    except FileNotFoundError:
        scan.found = False
        return scan
    except (OSError, UsageError) as e:
        scan.found, scan.error = False, f"cannot open: {getattr(e, 'strerror', None) or e}"
        return scan
    stop = None
    with f:
        reader = _HashingReader(f)  # type: ignore[arg-type]  # a Stream reads as a binary file does
        try:
            # a stream ("r|") only reads; typeshed's _Fileobj also asks for write, seek and tell
            with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                _read_samples(tar, scan, s)
                stop = tar.offset  # where tar readers stopped: the end marker, or a damaged header
        except (tarfile.TarError, OSError, EOFError) as e:
            scan.error = f"tar unreadable after {scan.count} samples: {e}"
        reader.drain()  # bytes past the end-of-archive marker count for size and checksum too
    scan.bytes, scan.sha256 = reader.n, reader.h.hexdigest()
    if stop is not None and scan.error is None:
        scan.stopped_early = _unreachable(folder, name, stop, reader.n, scan.count)
    return scan


def _unreachable(folder: Folder, name: str, stop: int, size: int, count: int) -> str | None:
    """tarfile ends quietly at a damaged header; data after where it stopped may be lost samples."""
    rest = folder.read_range(name, stop, size - stop) if size > stop else b""
    if rest.strip(b"\0"):
        return (f"tar readers stop at byte {stop} after {count} samples (a damaged header?); "
                f"{len(rest.rstrip(bytes(1)))} bytes after it are unreachable")
    return None


def _read_samples(tar: tarfile.TarFile, scan: ShardScan, s: ScanSettings) -> None:
    key: str | None = None
    members: dict[str, bytes] = {}
    offset = 0
    for m in tar:
        scan.checked["members"] += 1
        if not m.isfile():
            scan.offenders["member_types"].append(f"{scan.name}:{m.name}: a {_special(m)} member; pipe shard writes only regular files")
            continue
        try:
            k, ext = split_name(m.name)
            unnamed = None
        except ValueError:  # no key.ext: webdataset puts it in no sample
            k, ext = m.name, ""
            unnamed = "member without a key" if "." in m.name.rpartition("/")[2] else "member without an extension"
        if "/" in m.name:  # webdataset keeps the folders in the key; tar extracts ../ and / outside the folder
            scan.offenders["keys_unique"].append(f"{scan.name}:{m.name}: a member name with a path is not webdataset-safe")
        if unnamed is None and ext not in MEMBER_ORDER:
            scan.offenders["member_types"].append(
                f"{scan.name}:{m.name}: .{ext} is not a member type pipe shard writes ({', '.join(MEMBER_ORDER)})")
        member = tar.extractfile(m)
        if member is None:  # only a regular file (checked above) has data
            raise AssertionError(f"{m.name}: a regular file without data")
        data = member.read()
        if k != key:
            if key is not None:
                _sample(scan, key, offset, members, s)
            key, members, offset = k, {}, m.offset
        if unnamed is not None:
            scan.offenders["schema"].append(f"{scan.name}:{m.name}: {unnamed}")
        elif ext.lower() in members:
            scan.offenders["keys_unique"].append(f"{scan.name}:{key}: two .{ext} members in one sample")
        members[ext.lower()] = data
    if key is not None:
        _sample(scan, key, offset, members, s)


def _special(m: tarfile.TarInfo) -> str:
    return ("symlink" if m.issym() else "hard link" if m.islnk() else "folder" if m.isdir()
            else "device or FIFO" if m.isdev() else f"type {m.type!r}")


def _sample(scan: ShardScan, key: str, offset: int, members: dict[str, bytes], s: ScanSettings) -> None:
    where = f"{scan.name}:{key}"
    bad = scan.offenders
    scan.keys.append(key)
    scan.offsets.append(offset)
    if not is_safe_key(key.rpartition("/")[2]):  # a folder in the key is named once per member (`_read_samples`)
        bad["keys_unique"].append(f"{where}: key is not webdataset-safe (letters, digits, _ and - only)")
    label = _meta_label(members.get("json"), where, bad)
    scan.cls.append(_class(members.get("cls"), label, where, s, bad))
    img_ext = next((e for e in members if e in IMAGE_LIKE), None)
    txt_ext = next((e for e in members if e in TEXT_LIKE), None)
    if img_ext is None and txt_ext is None:
        bad["schema"].append(f"{where}: neither an image nor a text member (has {', '.join(sorted(members))})")
    phash = exact = sig = None
    if img_ext is not None:
        phash, exact = _image(members[img_ext], where, scan, s)
    if txt_ext is not None:
        t_exact, t_sig = _text(members[txt_ext], where, scan)
        if img_ext is None:
            exact, sig = t_exact, t_sig
    scan.image_hash.append(phash)
    scan.exact.append(exact)
    scan.text_sig.append(sig)


def _meta_label(data: bytes | None, where: str, bad) -> str | None:
    if data is None:
        return None
    try:
        meta = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        bad["schema"].append(f"{where}.json: not valid UTF-8 JSON: {e}")
        return None
    except RecursionError:  # "[[[[..." 100,000 deep: hostile, and no crash of pipe check
        bad["schema"].append(f"{where}.json: JSON nested too deeply to parse")
        return None
    if not isinstance(meta, dict):
        bad["schema"].append(f"{where}.json: not a JSON object")
        return None
    label = meta.get("label")
    if "label" in meta and label is None:
        return NO_LABEL
    return label if isinstance(label, str) else None


NO_LABEL = ""  # what `_meta_label` returns for a .json whose label is null (no label name is empty)


def _class(data: bytes | None, label: str | None, where: str, s: ScanSettings, bad) -> int | None:
    """The sample's class index; an image-caption pair without a label has no .cls and says so
    in its .json (label null)."""
    if data is None:
        if label != NO_LABEL:
            bad["labels_in_range"].append(f"{where}: no .cls member")
        return None
    try:
        cls = int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        bad["labels_in_range"].append(f"{where}.cls: not an integer: {data[:20]!r}")
        return None
    if not 0 <= cls < len(s.classes):
        bad["labels_in_range"].append(f"{where}.cls: {cls} is outside 0..{len(s.classes) - 1}")
        return None
    if label is not None and label != s.classes[cls]:
        said = "no label" if label == NO_LABEL else repr(label)
        bad["labels_in_range"].append(f"{where}: .cls {cls} is {s.classes[cls]!r} but .json says {said}")
    return cls


def _image(data: bytes, where: str, scan: ShardScan, s: ScanSettings) -> tuple[int | None, str | None]:
    f = inspect_image(data, deep=s.deep, want_phash=True)  # the hash needs pixels: leakage
    scan.checked["images"] += 1
    scan.checked["decoded"] += f.decoded
    if f.width is None:
        scan.offenders["image_size"].append(f"{where}: {f.error}")
        return None, f.exact
    if s.image_size is not None and (f.width, f.height) != (s.image_size, s.image_size):
        scan.offenders["image_size"].append(f"{where}: {f.width}x{f.height}")
    if f.mode != s.image_mode:
        scan.offenders["image_mode"].append(f"{where}: mode {f.mode}")
    if f.error:
        scan.offenders["decodes"].append(f"{where}: {f.error}")
    return f.phash, f.exact


def _text(data: bytes, where: str, scan: ShardScan) -> tuple[str | None, bytes | None]:
    import xxhash

    from pipeline.similarity.minhash import normalize_for_shingles, text_signature

    scan.checked["texts"] += 1
    why = text_problem(data)
    if why:
        scan.offenders["text_encoding"].append(f"{where}.txt: {why}")
    text = data.decode("utf-8", "replace")
    return xxhash.xxh3_128_hexdigest(normalize_for_shingles(text).encode("utf-8")), text_signature(text)
