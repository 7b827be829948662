"""Checks on a SHARD_DIR (the output of `pipe shard`, or shards a user assembled another way).

`load` reads index.json, then scans every indexed shard once (`tarscan`, in worker processes when
there is enough to read): checksum, size, samples, keys, classes, image headers and perceptual
hashes, texts. Each check is then a small function of the loaded folder and the policy. The
shards' own contents are the truth: leakage is found from the samples' pixels and texts, not
from anything the index or pipe clean recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.check import classes as class_checks
from pipeline.check.leakage import copies, exact_pairs, near_image_pairs, near_text_pairs, same_views
from pipeline.check.policy import Policy
from pipeline.check.registry import check
from pipeline.check.result import WARNING, CheckResult, at_most, fail, ok, skip, verdict
from pipeline.check.tarscan import ScanSettings, ShardScan, scan_shard
from pipeline.core.cores import worker_count
from pipeline.formats import index as shard_index
from pipeline.storage import Folder

IN_PROCESS_BYTES = 64 << 20  # below this much tar, a process pool costs more than it saves


@dataclass
class ShardDir:
    root: Folder
    deep: bool = False
    index: dict | None = None
    problem: str | None = None
    """Why index.json could not be used at all."""
    entries: list[dict] = field(default_factory=list)
    """The index's shard entries that are objects (the rest are schema violations)."""
    scans: list[ShardScan] = field(default_factory=list)
    """One per entry, in index order."""
    classes: tuple[str, ...] = ()
    copies: tuple | None = None
    """(samples, `leakage.Copies`) once `_copies` has searched every sample for copies."""

    def split(self, name: str) -> list[tuple[dict, ShardScan]]:
        return [(e, s) for e, s in zip(self.entries, self.scans) if e.get("split") == name]


def load(root: Folder, deep: bool, policy: Policy, workers: int = 0, advance=lambda: None) -> ShardDir:
    """Read index.json and scan every indexed shard; ``advance()`` is called once per shard read."""
    d = ShardDir(root, deep)
    d.index, unreadable = shard_index.parse(root)
    if unreadable is not None:
        d.problem = f"index.json is not readable JSON: {unreadable}"
        return d
    shards = d.index.get("shards") if isinstance(d.index, dict) else None
    if not isinstance(shards, list):
        d.problem = "index.json has no list of shards"
        return d
    d.entries = [e for e in shards if isinstance(e, dict) and isinstance(e.get("name"), str)]
    classes = d.index.get("classes")
    d.classes = tuple(str(c) for c in classes) if isinstance(classes, list) else ()
    size = policy.image_size if policy.image_size is not None else _int_or_none(d.index.get("image_size"))
    settings = ScanSettings(deep, size, policy.image_mode, d.classes)
    d.scans = _scan_all(root, d.entries, settings, workers, advance)
    return d


def _int_or_none(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _scan_all(root: Folder, entries: list[dict], s: ScanSettings, workers: int, advance) -> list[ShardScan]:
    """Every indexed shard scanned once, streamed from the folder (a pool of processes when
    there is enough to read); a name that would leave the folder (../, absolute, a link out)
    points nowhere."""
    jobs = [(root, e["name"], s) for e in entries]
    sizes = {e.rel: e.size for e in root.list()}
    total = sum(sizes.get(name, 0) for _, name, _ in jobs)
    results: Iterator[ShardScan]
    if len(jobs) < 2 or total < IN_PROCESS_BYTES or workers == 1:
        results = map(scan_shard, jobs)
    else:
        from pipeline.core.executor import OrderedPool

        pool = OrderedPool(scan_shard, min(worker_count(workers), len(jobs)))
        results = pool.map(jobs, on_crash=lambda job, e: ShardScan(job[1], error=f"reading it crashed a worker: {e}"))
    scans = []
    for scan in results:
        scans.append(scan)
        advance()
    return scans


def _top_tars(root: Folder) -> list[str]:
    """The .tar files directly in the folder (a shard dir's shards are there, not deeper), sorted."""
    return sorted(e.rel for e in root.list() if "/" not in e.rel and e.rel.endswith(".tar"))


def _offenders(d: ShardDir, check: str) -> list[str]:
    return [o for s in d.scans for o in s.offenders.get(check, [])]


def _checked(d: ShardDir, what: str) -> int:
    return sum(s.checked[what] for s in d.scans)


def _unusable(d: ShardDir, name: str) -> CheckResult | None:
    return skip(name, d.problem) if d.problem else None


# --------------------------------------------------------------------------- checks


@check("shard")
def check_schema(d: ShardDir, p: Policy) -> CheckResult:
    """Every document read (index.json, the .json member of each sample) matches its schema."""
    from pipeline.core.schemas import errors

    if d.problem:
        return fail("schema", d.problem, [d.problem])
    found = [f"index.json: {e}" for e in errors(d.index, "index")] + _offenders(d, "schema")
    return verdict("schema", found, 1 + sum(s.count for s in d.scans), "documents break their schema",
                   f"index.json matches schemas/index.schema.json; the .json of all {sum(s.count for s in d.scans)} samples parse")


@check("shard")
def check_shard_checksums(d: ShardDir, p: Policy) -> CheckResult:
    """Every indexed shard exists with the indexed byte size and SHA-256; no unindexed shard files."""
    if r := _unusable(d, "shard_checksums"):
        return r
    offenders = []
    for e, s in zip(d.entries, d.scans):
        if not s.found:
            offenders.append(f"{e['name']}: missing" + (f" ({s.error})" if s.error else ""))
            continue
        if s.bytes != e.get("bytes"):
            offenders.append(f"{e['name']}: {s.bytes} bytes, index says {e.get('bytes')}")
        if s.sha256 != e.get("sha256"):
            offenders.append(f"{e['name']}: sha256 {s.sha256[:12]}..., index says {str(e.get('sha256'))[:12]}...")
    indexed = {e["name"] for e in d.entries}
    offenders += [f"{name}: a shard file index.json does not list (stale? readers never see it)"
                  for name in _top_tars(d.root) if name not in indexed]
    return verdict("shard_checksums", offenders, len(d.entries), "shards differ from index.json",
                   f"all {len(d.entries)} shards have the indexed size and sha256",
                   bytes=sum(s.bytes for s in d.scans))


@check("shard")
def check_shard_counts(d: ShardDir, p: Policy) -> CheckResult:
    """Every shard holds the indexed number of samples, starting at the indexed byte offsets."""
    if r := _unusable(d, "shard_counts"):
        return r
    offenders = []
    for e, s in zip(d.entries, d.scans):
        if not s.found:
            continue  # shard_checksums reports it
        if s.error:
            offenders.append(f"{e['name']}: {s.error}")
        if s.count != e.get("count"):
            why = f" ({s.stopped_early})" if s.stopped_early else ""
            offenders.append(f"{e['name']}: {s.count} samples, index says {e.get('count')}{why}")
        if isinstance(e.get("offsets"), list) and s.offsets != e["offsets"]:
            at = next((i for i, (a, b) in enumerate(zip(s.offsets, e["offsets"])) if a != b), min(len(s.offsets), len(e["offsets"])))
            offenders.append(f"{e['name']}: sample offsets differ from the index from sample {at} on")
    offenders += _split_totals(d)
    return verdict("shard_counts", offenders, len(d.entries), "shards hold other samples than indexed",
                   f"{sum(s.count for s in d.scans)} samples, as indexed, each at its indexed offset",
                   samples=sum(s.count for s in d.scans))


def _split_totals(d: ShardDir) -> list[str]:
    """index.json's counts.{split}.samples and per_class agree with what the shards hold."""
    counts = d.index.get("counts") if isinstance(d.index, dict) else None
    out = []
    for split in ("train", "val"):
        want = counts.get(split) if isinstance(counts, dict) else None
        if not isinstance(want, dict):
            continue
        pairs = d.split(split)
        n = sum(s.count for _, s in pairs)
        if isinstance(want.get("samples"), int) and want["samples"] != n:
            out.append(f"counts.{split}.samples is {want['samples']}, the {split} shards hold {n}")
        got = per_class(d, split)
        if isinstance(want.get("per_class"), dict):
            wanted = {c: v for c, v in want["per_class"].items() if v}
            have = {c: v for c, v in got.items() if v}
            if wanted != have:
                diff = sorted(c for c in set(wanted) | set(have) if wanted.get(c) != have.get(c))
                out.append(f"counts.{split}.per_class disagrees with the shards for {', '.join(map(repr, diff[:5]))}")
    return out


@check("shard")
def check_keys_unique(d: ShardDir, p: Policy) -> CheckResult:
    """Sample keys are unique and safe for webdataset: letters, digits, _ and - only; a member name
    with a folder, ../ or a leading / fails."""
    if r := _unusable(d, "keys_unique"):
        return r
    seen: dict[str, str] = {}
    offenders = list(_offenders(d, "keys_unique"))
    for s in d.scans:
        for k in s.keys:
            if k in seen:
                offenders.append(f"key {k!r} in {seen[k]} and again in {s.name}")
            else:
                seen[k] = s.name
    total = sum(s.count for s in d.scans)
    return verdict("keys_unique", offenders, total, "samples have a clashing or unsafe key",
                   f"{total} keys, unique across all shards and webdataset-safe")


@check("shard")
def check_member_types(d: ShardDir, p: Policy) -> CheckResult:
    """Every member is a regular file of a type pipe shard writes (.jpg, .png, .webp, .txt, .cls,
    .json); a .pyd, .pickle or .pth member (which stock webdataset's .decode() unpickles), a link or
    any other type fails.

    Only the member types pipe's codec writes: stock webdataset's ``.decode()`` unpickles
    ``.pyd``, ``.pickle`` and ``.pth`` members (running whatever they carry), and a link or device
    member is something else again when the shard is extracted."""
    if r := _unusable(d, "member_types"):
        return r
    n = _checked(d, "members")
    return verdict("member_types", _offenders(d, "member_types"), n,
                   "members are not what pipe shard writes (readers that decode by extension may run them)",
                   f"all {n} members are regular files of the types pipe shard writes (.jpg .png .webp .txt .cls .json)")


@check("shard")
def check_labels_in_range(d: ShardDir, p: Policy) -> CheckResult:
    """Every .cls is an integer index into index.json classes and agrees with the sample's label name."""
    if r := _unusable(d, "labels_in_range"):
        return r
    offenders = _offenders(d, "labels_in_range")
    if p.classes is not None and set(p.classes) != set(d.classes):
        extra, missing = sorted(set(d.classes) - set(p.classes)), sorted(set(p.classes) - set(d.classes))
        offenders = [f"index.json classes differ from the policy's: extra {extra}, missing {missing}", *offenders]
    total = sum(s.count for s in d.scans)
    return verdict("labels_in_range", offenders, total, "samples have a bad class",
                   f"every .cls of {total} samples indexes one of {len(d.classes)} classes and agrees with its .json label",
                   classes=len(d.classes))


def per_class(d: ShardDir, split: str) -> Counter:
    """Samples per class name in a split; every indexed class present, zeros included."""
    c = Counter({name: 0 for name in d.classes})
    for _, s in d.split(split):
        c.update(d.classes[i] for i in s.cls if i is not None)
    return c


@check("shard")
def check_min_samples_per_class(d: ShardDir, p: Policy) -> CheckResult:
    """Every class has at least min_samples_per_class train samples."""
    return _unusable(d, "min_samples_per_class") or class_checks.min_samples(per_class(d, "train"), p, "train samples")


@check("shard", severity=WARNING)
def check_class_imbalance(d: ShardDir, p: Policy) -> CheckResult:
    """Biggest class / smallest class <= max_class_imbalance, in train samples."""
    counts = per_class(d, "train")
    if any(v == 0 for v in counts.values()):
        counts = Counter({k: v for k, v in counts.items() if v})  # an empty class is min_samples' finding
    return _unusable(d, "class_imbalance") or class_checks.imbalance(counts, p)


@check("shard", severity=WARNING)
def check_distinct_labels(d: ShardDir, p: Policy) -> CheckResult:
    """No two class names differ only by case or character form ("Cat" and "cat"; an NFC and an
    NFD "café"): likelier one class spelled twice than two."""
    return _unusable(d, "distinct_labels") or class_checks.distinct(list(d.classes))


@check("shard")
def check_val_has_every_class(d: ShardDir, p: Policy) -> CheckResult:
    """Every class in index.json has at least one val sample."""
    name = "val_has_every_class"
    if r := _unusable(d, name):
        return r
    val = per_class(d, "val")
    absent = sorted(c for c, n in val.items() if n == 0)
    return verdict(name, [f"class {c!r} has no val sample" for c in absent], len(val),
                   "classes are missing from val (their val accuracy cannot be measured)",
                   f"all {len(val)} classes have val samples (fewest: {min(val.values(), default=0)})")


@check("shard")
def check_leakage(d: ShardDir, p: Policy) -> CheckResult:
    """At most max_leaked_samples val samples have an exact or near duplicate in train."""
    name = "leakage"
    if r := _unusable(d, name):
        return r
    train, val = _pool(d, "train"), _pool(d, "val")
    leaks: dict[int, str] = {}
    for j, i in exact_pairs(train["exact"], val["exact"]):
        leaks[j] = f"val {val['where'][j]} = train {train['where'][i]} (exact)"
    unconfirmed = 0
    for j, i, dist in near_image_pairs(train["hash"], val["hash"], p.near_duplicate_phash_distance):
        same, how = _same_picture(d, val["loc"][j], train["loc"][i])
        if not same:
            unconfirmed += 1  # close hashes, different pictures (two handwritten 1s): not a leak
            continue
        leaks.setdefault(j, f"val {val['where'][j]} ~ train {train['where'][i]} (image, {dist} bits apart{how})")
    # candidates from MinHash's estimate with a margin for its error (64 values: about +-0.05),
    # each then judged by its real Jaccard, so a pair truly at the limit is not missed either
    for j, i, sim in near_text_pairs(train["sig"], val["sig"], max(0.0, p.near_duplicate_text_similarity - 0.1)):
        exact = _text_similarity(d, val["loc"][j], train["loc"][i])
        if (exact if exact is not None else sim) < p.near_duplicate_text_similarity:
            unconfirmed += 1  # MinHash's estimate erred upwards: the real Jaccard is below the limit
            continue
        leaks.setdefault(j, f"val {val['where'][j]} ~ train {train['where'][i]} (text, {exact if exact is not None else sim:.0%} alike)")
    unhashed = sum(h is None and sig is None for h, sig in zip(train["hash"] + val["hash"], train["sig"] + val["sig"]))
    nums = dict(val=len(val["where"]), train=len(train["where"]), leaked=len(leaks), limit=p.max_leaked_samples,
                phash_distance=p.near_duplicate_phash_distance, text_similarity=p.near_duplicate_text_similarity,
                not_hashed=unhashed, candidates_not_confirmed=unconfirmed)
    found = [leaks[j] for j in sorted(leaks)]
    if len(leaks) > p.max_leaked_samples:
        return fail(name, f"{len(leaks)} of {len(val['where'])} val samples leak from train: {found[0]}", found, **nums)
    result = ok(name, f"{len(leaks)} of {len(val['where'])} val samples have an exact or near duplicate in train "
                      f"(limit {p.max_leaked_samples})", **nums)
    result.examples = found[:10]
    return result


@check("shard")
def check_duplicates(d: ShardDir, p: Policy) -> CheckResult:
    """At most max_duplicate_samples samples of one split (train, val) are an exact or near copy of
    another in that split.

    Exact or near copies inside one split: the same sample trained on (or validated) twice
    weighs double, whatever caption or key it came with."""
    name = "duplicates"
    if r := _unusable(d, name):
        return r
    pool, found = _copies(d, p)
    lines = [f"{pool['where'][j]} ~ {pool['where'][i]} ({how})" for j, (i, how) in sorted(found.same_group.items())]
    return at_most(name, lines, p.max_duplicate_samples, len(pool["where"]),
                    "samples are exact or near copies of another sample of their split",
                    "samples are an exact or near copy of another sample of their split",
                    candidates_not_confirmed=found.unconfirmed)


@check("shard")
def check_label_conflicts(d: ShardDir, p: Policy) -> CheckResult:
    """At most max_label_conflicts samples are an exact or near copy of a sample under another label,
    across splits too.

    One content under two classes, in one split or across them: the model is taught both answers."""
    name = "label_conflicts"
    if r := _unusable(d, name):
        return r
    pool, found = _copies(d, p)
    cls = pool["cls"]
    lines = [f"{pool['where'][j]} ({_class_name(d, cls[j])}) ~ {pool['where'][i]} ({_class_name(d, cls[i])}) ({how})"
             for j, (i, how) in sorted(found.other_label.items())]
    return at_most(name, lines, p.max_label_conflicts, len(pool["where"]),
                    "samples are copies of a sample of another class",
                    "samples are an exact or near copy of a sample of another class",
                    candidates_not_confirmed=found.unconfirmed)


def _class_name(d: ShardDir, c: int | None) -> str:
    return d.classes[c] if c is not None and 0 <= c < len(d.classes) else "no class"


def _copies(d: ShardDir, p: Policy):
    """Every sample of every split searched once for copies (shared by duplicates and label_conflicts)."""
    if d.copies is None:
        pool: dict[str, list] = {"where": [], "exact": [], "hash": [], "sig": [], "loc": [], "split": [], "cls": []}
        for e, s in zip(d.entries, d.scans):
            part = _pool_of([s])
            for k in ("where", "exact", "hash", "sig", "loc"):
                pool[k] += part[k]
            pool["split"] += [str(e.get("split"))] * len(part["where"])
            pool["cls"] += list(s.cls[: len(part["where"])])
        from functools import lru_cache

        loc = pool["loc"]
        # a picture with many look-alikes is decoded once
        view = lru_cache(maxsize=1024)(lambda k: _view(d.root, loc[k][0], loc[k][1], loc[k][2]))
        found = copies(pool["exact"], pool["hash"], pool["sig"], pool["split"], pool["cls"],
                       p.near_duplicate_phash_distance, p.near_duplicate_text_similarity,
                       lambda i, j: same_views(view(j), view(i)), lambda i, j: _text_similarity(d, loc[j], loc[i]))
        d.copies = (pool, found)
    return d.copies


def _same_picture(d: ShardDir, a: tuple[str, int, int], b: tuple[str, int, int]) -> tuple[bool, str]:
    """Whether two samples' images (shard, start, end) show the same picture, on pixels, as
    `pipe clean` confirms its near duplicates (`perceptual.same_picture`): a perceptual hash
    within a few bits is a candidate, not a verdict. An image that cannot be read back stays a
    leak (the check does not pass on what it could not look at)."""
    return same_views(_view(d.root, a[0], a[1], a[2]), _view(d.root, b[0], b[1], b[2]))


def _text_similarity(d: ShardDir, a: tuple[str, int, int], b: tuple[str, int, int]) -> float | None:
    """The exact Jaccard similarity of two samples' texts (character 5-grams, as `pipe clean`
    confirms its near-duplicate texts), or None when either cannot be read back."""
    from pipeline.similarity.minhash import jaccard, shingles

    ta, tb = _text(_members(d.root, a[0], a[1], a[2])), _text(_members(d.root, b[0], b[1], b[2]))
    try:
        return None if ta is None or tb is None else jaccard(shingles(ta.decode("utf-8")), shingles(tb.decode("utf-8")))
    except UnicodeDecodeError:
        return None


def _text(fields: dict[str, bytes]) -> bytes | None:
    """A sample's text, as `tarscan` took it (the first member of a text type)."""
    from pipeline.formats.sample import TEXT_LIKE

    return next((data for ext, data in fields.items() if ext in TEXT_LIKE), None)


def _view(root: Folder, name: str, start: int, end: int):
    """The perceptual view of the image of the sample at bytes ``start..end`` of a shard, or None."""
    import io

    from pipeline.formats.sample import IMAGE_LIKE
    from pipeline.similarity.perceptual import load_view

    fields = _members(root, name, start, end)
    image = next((data for ext, data in fields.items() if ext in IMAGE_LIKE), None)  # as `tarscan` took it
    try:
        size = json.loads(fields["json"]).get("image", {}) if "json" in fields else {}
    except (ValueError, AttributeError, RecursionError):
        size = {}
    return None if image is None else load_view(io.BytesIO(image), size.get("width"), size.get("height"), "pad")


def _members(root: Folder, name: str, start: int, end: int) -> dict[str, bytes]:
    """The members of the sample at bytes ``start..end`` of a shard by extension, lower-cased as
    `tarscan` reads them ({} if unreadable; a member without key.ext is left out)."""
    from pipeline.formats import tarstream
    from pipeline.formats.sample import split_name

    try:
        if not root.contained(name):
            return {}
        buf = root.read_range(name, start, end - start)
        heads = tarstream.members(buf)
    except (OSError, ValueError):
        return {}
    out = {}
    for name, at, size in heads:
        try:
            ext = split_name(name)[1].lower()
        except ValueError:
            continue
        out[ext] = buf[at + tarstream.BLOCK : at + tarstream.BLOCK + size]
    return out


def _pool(d: ShardDir, split: str) -> dict[str, list]:
    return _pool_of([s for _, s in d.split(split)])


def _pool_of(scans: list[ShardScan]) -> dict[str, list]:
    out: dict[str, list] = {"where": [], "exact": [], "hash": [], "sig": [], "loc": []}
    for s in scans:
        ends = [*s.offsets[1:], s.bytes]
        out["loc"] += [(s.name, start, end) for start, end in zip(s.offsets, ends)]
        out["where"] += [f"{s.name}:{k}" for k in s.keys]
        out["exact"] += s.exact
        out["hash"] += s.image_hash
        out["sig"] += s.text_sig
    return out


@check("shard")
def check_image_size(d: ShardDir, p: Policy) -> CheckResult:
    """Every image is image_size x image_size pixels (unset: index.json's image_size)."""
    name = "image_size"
    if r := _unusable(d, name):
        return r
    recorded = d.index.get("image_size") if isinstance(d.index, dict) else None  # a dict: d.problem is unset
    size = p.image_size if p.image_size is not None else _int_or_none(recorded)
    n = _checked(d, "images")
    if size is None:
        return (skip(name, "no image_size in index.json nor in the policy") if n else
                ok(name, "no images", checked=0))
    return verdict(name, _offenders(d, name), n, f"images are not {size}x{size}", f"all {n} images are {size}x{size}", size=size)


@check("shard")
def check_image_mode(d: ShardDir, p: Policy) -> CheckResult:
    """Every image has mode image_mode."""
    n = _checked(d, "images")
    return _unusable(d, "image_mode") or verdict("image_mode", _offenders(d, "image_mode"), n, f"images are not {p.image_mode}",
                                                 f"all {n} images are {p.image_mode}", mode=p.image_mode)


@check("shard")
def check_text_encoding(d: ShardDir, p: Policy) -> CheckResult:
    """Every text is valid UTF-8, without BOM, in NFC, with \\n newlines and no control characters."""
    n = _checked(d, "texts")
    return _unusable(d, "text_encoding") or verdict("text_encoding", _offenders(d, "text_encoding"), n,
                                                    "texts are not clean UTF-8",
                                                    f"all {n} texts are UTF-8, NFC, without BOM or control characters")


@check("shard")
def check_decodes(d: ShardDir, p: Policy) -> CheckResult:
    """Every image decodes: with --deep completely, and every member parses; without it at reduced
    scale, to hash it."""
    if r := _unusable(d, "decodes"):
        return r
    n, decoded = _checked(d, "images"), _checked(d, "decoded")
    offenders = _offenders(d, "decodes")
    how = "completely" if d.deep else "at reduced scale, to hash them (--deep decodes every pixel)"
    return verdict("decodes", offenders, n, "images do not decode", f"all {decoded} images decode {how}", decoded=decoded)
