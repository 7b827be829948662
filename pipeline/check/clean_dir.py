"""Checks on a CLEAN_DIR (the output of `pipe clean`): manifest.parquet, report.json, data/.

`load` reads the folder once (manifest rows, report, the kept outputs' headers or pixels); each
check is a small function of the loaded folder and the policy that returns a `CheckResult`.
A file that cannot be read is a finding (the schema check fails, the checks that need it skip),
never a crash.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pipeline.check import classes as class_checks
from pipeline.check.content import ImageFacts, inspect_image, text_problem
from pipeline.check.policy import Policy
from pipeline.check.registry import check
from pipeline.check.result import WARNING, CheckResult, at_most, fail, ok, skip, verdict
from pipeline.core.cores import worker_count
from pipeline.core.errors import StageFailed, UsageError
from pipeline.formats.manifest_row import ADDED_LATER, NAMES
from pipeline.formats.vocabulary import Kind, Status
from pipeline.storage import Folder, Location, location, open_folder

IN_PROCESS_FILES = 2000  # --deep: fewer kept outputs are decoded in this process (a pool costs ~1 s to start)
CHUNK = 256  # outputs per worker task
MISSING = "<missing>"  # an output the manifest names that is not on disk (a text's "no problem" is None)
Found = tuple[str, str, ImageFacts | str | None]
"""(output, kind, ImageFacts | text problem or None | MISSING): what `inspect_chunk` found of one output."""


@dataclass
class CleanDir:
    root: Folder
    deep: bool = False
    report: dict | None = None
    rows: list[dict] | None = None
    """The manifest's rows as Arrow reads them, plain dicts named through `NAMES`: the schema check
    needs the raw rows, and a million `ManifestRow` objects would only slow the check down."""
    problems: list[str] = field(default_factory=list)
    """Files that could not be read or parsed at all (reported by the schema check)."""
    older: list[str] = field(default_factory=list)
    """Columns the manifest lacks because an older pipe clean wrote it (`ADDED_LATER`): read as null."""
    input: Folder | None = None
    """The raw input folder to compare the manifest with, when it is reachable."""
    input_note: str = ""
    images: dict[str, ImageFacts] = field(default_factory=dict)
    """Kept image output path -> what its header (or, deep, its pixels) says."""
    texts: dict[str, str | None] = field(default_factory=dict)
    """Kept text output path -> its problem, None when clean."""
    missing: list[str] = field(default_factory=list)
    """Kept outputs the manifest names that are not on disk."""
    copies: tuple | None = None
    """(samples, `leakage.Copies`) once `_copies` has searched the kept samples for copies."""
    workers: int = 0
    """Worker processes for work over every kept output (0: as many as the cores allow)."""

    @cached_property
    def kept_rows(self) -> list[dict]:
        return [r for r in self.rows or [] if r.get(NAMES.status) == Status.KEPT]

    def kept(self) -> list[dict]:
        return self.kept_rows

    def settings(self) -> dict:
        """report.json's settings, or {} when the report is missing or malformed (the schema check says so)."""
        s = self.report.get("settings") if isinstance(self.report, dict) else None
        return s if isinstance(s, dict) else {}


def is_clean_dir(root: Folder) -> bool:
    return root.exists("manifest.parquet")


def looks_unfinished(root: Folder) -> bool:
    """A folder `pipe clean` started but did not finish (no manifest yet); a shard dir has a marker too."""
    from pipeline.storage.output import read_marker

    return (read_marker(root) or {}).get("tool") == "pipe clean" and not is_clean_dir(root)


def load(root: Location | Folder, deep: bool = False, input_override: Location | Folder | None = None,
         workers: int = 0) -> CleanDir:
    root = open_folder(root)
    d = CleanDir(root, deep, workers=workers)
    d.report = _read_json(root, "report.json", d.problems)
    d.rows = _read_manifest(root, d.problems, d.older)
    d.input, d.input_note = _find_input(root, d.settings(), input_override)
    if d.rows is not None:
        _inspect_outputs(d, workers)
    return d


def _read_json(root: Folder, name: str, problems: list[str]):
    try:
        return json.loads(root.read(name).decode("utf-8"))
    except FileNotFoundError:
        problems.append(f"{name} is missing")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problems.append(f"{name} is not readable JSON: {e}")
    return None


def _read_manifest(root: Folder, problems: list[str], older: list[str]) -> list[dict] | None:
    """The rows; a manifest of an older pipe clean, without the columns added since (`ADDED_LATER`),
    reads as if they were null (what pipe clean writes where it has no value), named in ``older``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(root.read("manifest.parquet")))
    except (OSError, pa.ArrowException) as e:
        problems.append(f"manifest.parquet is not a readable Parquet file: {e}")
        return None
    older += [c for c in ADDED_LATER if c not in table.column_names]
    rows = table.to_pylist()
    if older:
        for r in rows:
            r.update(dict.fromkeys(older))
    return rows


def _find_input(root: Folder, settings: dict, override: Location | Folder | None) -> tuple[Folder | None, str]:
    """The input folder: --input, else report.json's settings.input, else the one .pipe/state.json keeps."""
    from pipeline.storage.output import read_marker

    if override is not None:
        return open_folder(override), ""  # checked to be a folder by the stage
    tried = []
    if isinstance(settings.get("input"), str) and settings["input"]:
        tried.append(settings["input"])
    state = read_marker(root) or {}
    if isinstance(state.get("input"), str) and state["input"]:
        tried.append(state["input"])
    for where in tried:
        try:
            folder = open_folder(location(where))
            if folder.state() == "folder":
                return folder, ""
        except (UsageError, StageFailed):  # a URL of no known storage, or storage that cannot be reached
            continue
    where = " or ".join(dict.fromkeys(tried)) or "(not recorded)"
    return None, f"the input folder {where} is not here; pass --input to compare"


def _inspect_outputs(d: CleanDir, workers: int) -> None:
    jobs = [(str(r.get(NAMES.output) or ""), r[NAMES.kind], d.root, d.deep)  # r[kind]: there, it is image or text
            for r in d.kept() if r.get(NAMES.kind) in (Kind.IMAGE, Kind.TEXT)]
    if d.deep and len(jobs) >= IN_PROCESS_FILES and workers != 1:
        from pipeline.core.executor import OrderedPool

        chunks = [jobs[i : i + CHUNK] for i in range(0, len(jobs), CHUNK)]
        pool = OrderedPool(inspect_chunk, min(worker_count(workers), len(chunks)))
        found = [x for part in pool.map(chunks, on_crash=_crashed_chunk) for x in part]
    else:
        found = inspect_chunk(jobs)
    for out, _, facts in found:
        if facts is MISSING:
            d.missing.append(out)
        elif isinstance(facts, ImageFacts):  # what inspect_image says of every image on disk
            d.images[out] = facts
        else:
            d.texts[out] = facts


def inspect_chunk(jobs: list[tuple[str, str, Folder, bool]]) -> list[Found]:
    """(output, kind, ImageFacts | text problem or None | MISSING) for each kept output (a worker's unit)."""
    found: list[Found] = []
    for out, kind, root, deep in jobs:
        data = _output_bytes(root, out)
        if data is None:
            found.append((out, kind, MISSING))
            continue
        found.append((out, kind, inspect_image(data, deep=deep) if kind == Kind.IMAGE else text_problem(data)))
    return found


def _output_bytes(root: Folder, rel: str) -> bytes | None:
    """A kept output's bytes; None when it is not there ("" or a path leaving CLEAN_DIR names no output of ours)."""
    try:
        return root.read(rel) if rel and root.contained(rel) else None
    except (OSError, UsageError):
        return None


def _crashed_chunk(jobs: list[tuple[str, str, Folder, bool]], exc: BaseException) -> list[Found]:
    """A decoder killed its worker on one of these files: judge them one by one, in this process, header only."""
    out = []
    for o, kind, root, _ in jobs:
        [(o, kind, facts)] = inspect_chunk([(o, kind, root, False)])
        if isinstance(facts, ImageFacts):  # an image on disk (MISSING and a text's problem are strings)
            facts.error = facts.error or f"decoding crashed a worker process ({exc}) on this file or one near it"
        out.append((o, kind, facts))
    return out


# --------------------------------------------------------------------------- checks


@check("clean")
def check_schema(d: CleanDir, p: Policy) -> CheckResult:
    """Every document read (the rows of manifest.parquet, report.json) matches its schema."""
    from pipeline.check.validate import each_error
    from pipeline.core.schemas import errors

    found = list(d.problems)
    if d.report is not None:
        found += [f"report.json: {e}" for e in errors(d.report, "report")]
    rows = d.rows or []
    found += [f"manifest row {rows[i].get(NAMES.source)!r}: {e}" for i, e in each_error(rows, "manifest_row")]
    n = len(d.rows or []) + (d.report is not None)
    older = (f" (manifest.parquet is from an older pipe clean, without {', '.join(d.older)}: pipe shard decodes the "
             "images to measure them; re-run pipe clean to record them)") if d.older else ""
    return verdict("schema", found, n, "documents break their schema",
                   f"report.json and {len(d.rows or [])} manifest rows match their schemas{older}")


@check("clean")
def check_manifest_matches_input(d: CleanDir, p: Policy) -> CheckResult:
    """The manifest has exactly one row per file in the input folder (when that folder is reachable)."""
    name = "manifest_matches_input"
    if d.rows is None:
        return skip(name, "no readable manifest")
    if d.input is None:
        return skip(name, d.input_note)
    from pipeline.clean.discover import discover

    exclude = _labels_file(d)
    on_disk = {c.source for c in discover(d.input, labels={}, exclude=exclude)}
    listed = Counter(r.get(NAMES.source) for r in d.rows)
    missing = sorted(s for s in on_disk if s not in listed)
    # key=str: a damaged manifest's null source (None) sorts among the names instead of crashing the check
    gone = sorted((s for s in listed if s not in on_disk), key=str)
    twice = sorted((s for s, n in listed.items() if n > 1), key=str)
    offenders = ([f"{s}: in the input, not in the manifest" for s in missing]
                 + [f"{s}: in the manifest, not in the input" for s in gone]
                 + [f"{s}: listed {listed[s]} times" for s in twice])
    return verdict(name, offenders, len(on_disk), "input files and manifest rows disagree",
                   f"{len(d.rows)} manifest rows = {len(on_disk)} files in {d.input.url}",
                   files=len(on_disk), rows=len(d.rows), not_in_manifest=len(missing), not_in_input=len(gone))


def _labels_file(d: CleanDir) -> set[str]:
    labels = d.settings().get("labels")
    root = d.input.local_path if d.input is not None else None
    if not isinstance(labels, str) or not labels or root is None:
        return set()
    try:
        return {Path(labels).resolve().relative_to(root.resolve()).as_posix()}
    except ValueError:
        return set()


@check("clean")
def check_outputs_match_manifest(d: CleanDir, p: Policy) -> CheckResult:
    """Every kept row's output exists under data/, and data/ holds nothing else."""
    name = "outputs_match_manifest"
    if d.rows is None:
        return skip(name, "no readable manifest")
    listed = {r.get(NAMES.output) for r in d.kept()}
    data = d.root.child("data")
    extra = sorted(f"data/{e.rel}" for e in data.walk() if f"data/{e.rel}" not in listed) if data.state() == "folder" else []
    offenders = [f"{o}: kept in the manifest, missing on disk" for o in d.missing] + [f"{o}: on disk, not in the manifest" for o in extra]
    return verdict(name, offenders, len(listed), "kept outputs and files under data/ disagree",
                   f"the {len(listed)} kept outputs are on disk and data/ holds nothing else",
                   missing=len(d.missing), unlisted=len(extra))


@check("clean")
def check_keys_unique(d: CleanDir, p: Policy) -> CheckResult:
    """Kept samples' keys are unique (an image and its caption share one) and safe for webdataset:
    letters, digits, _ and - only."""
    name = "keys_unique"
    if d.rows is None:
        return skip(name, "no readable manifest")
    from pipeline.formats.sample import is_safe_key

    by_kind = Counter((r.get(NAMES.key), r.get(NAMES.kind)) for r in d.kept())
    offenders = [f"key {k!r} is used by {n} kept {kind} files" for (k, kind), n in sorted(by_kind.items(), key=str) if n > 1]
    offenders += [f"key {r.get(NAMES.key)!r} ({r.get(NAMES.source)}) is not webdataset-safe"
                  for r in d.kept() if not is_safe_key(str(r.get(NAMES.key)))]
    return verdict(name, offenders, len(by_kind), "sample keys clash",
                   f"{len({k for k, _ in by_kind})} sample keys, unique and webdataset-safe")


@check("clean")
def check_labels_in_range(d: CleanDir, p: Policy) -> CheckResult:
    """Every kept sample of a labelled dataset has a label (in `classes` when set)."""
    name = "labels_in_range"
    if d.rows is None:
        return skip(name, "no readable manifest")
    kept = d.kept()
    labelled = [r for r in kept if r.get(NAMES.label) is not None]
    if not labelled:
        return ok(name, f"no labels: an unlabelled dataset of {len(kept)} kept files", kept=len(kept), labelled=0)
    offenders = [f"{r.get(NAMES.source)}: no label in a labelled dataset" for r in kept if r.get(NAMES.label) is None]
    offenders += [f"{r.get(NAMES.source)}: empty label" for r in labelled if not str(r[NAMES.label]).strip()]
    if p.classes is not None:
        allowed = set(p.classes)
        offenders += [f"{r.get(NAMES.source)}: label {r[NAMES.label]!r} not in the policy's classes"
                      for r in labelled if r[NAMES.label] not in allowed]
        absent = sorted(allowed - {r[NAMES.label] for r in labelled})
        offenders += [f"class {c!r} of the policy has no kept sample" for c in absent]
    return verdict(name, offenders, len(kept), "kept files have a bad label",
                   f"all {len(kept)} kept files carry one of {len({r[NAMES.label] for r in labelled})} labels",
                   kept=len(kept), labelled=len(labelled))


def _fraction(d: CleanDir, name: str, status: Status, limit: float) -> CheckResult:
    if d.rows is None:
        return skip(name, "no readable manifest")
    total = len(d.rows)
    n = sum(r.get(NAMES.status) == status for r in d.rows)
    frac = n / total if total else 0.0
    nums = dict(files=total, **{status.value: n}, fraction=round(frac, 6), limit=limit)
    if frac <= limit:
        return ok(name, f"{n} of {total} files {status} ({frac:.1%} <= {limit:.1%})", **nums)
    reasons = Counter(r.get(NAMES.reason) for r in d.rows if r.get(NAMES.status) == status)
    top = ", ".join(f"{k} {v}" for k, v in reasons.most_common(5))
    examples = [f"{r.get(NAMES.source)}: {r.get(NAMES.reason)}" for r in d.rows if r.get(NAMES.status) == status]
    return fail(name, f"{n} of {total} files {status} ({frac:.1%} > {limit:.1%}): {top}", examples, **nums)


@check("clean")
def check_quarantined_fraction(d: CleanDir, p: Policy) -> CheckResult:
    """Quarantined files / files <= max_quarantined_fraction."""
    return _fraction(d, "quarantined_fraction", Status.QUARANTINED, p.max_quarantined_fraction)


@check("clean")
def check_duplicate_fraction(d: CleanDir, p: Policy) -> CheckResult:
    """Duplicate files / files <= max_duplicate_fraction."""
    return _fraction(d, "duplicate_fraction", Status.DUPLICATE, p.max_duplicate_fraction)


def class_counts(d: CleanDir) -> Counter | None:
    """Kept samples per label; an image and its caption (one key) count once; unlabelled left out."""
    if d.rows is None:
        return None
    keys = {(r.get(NAMES.label), r.get(NAMES.key)) for r in d.kept() if r.get(NAMES.label) is not None}
    return Counter(label for label, _ in keys)


@check("clean")
def check_min_samples_per_class(d: CleanDir, p: Policy) -> CheckResult:
    """Every class has at least min_samples_per_class kept samples."""
    return class_checks.min_samples(class_counts(d), p, "kept samples")


@check("clean", severity=WARNING)
def check_class_imbalance(d: CleanDir, p: Policy) -> CheckResult:
    """Biggest class / smallest class <= max_class_imbalance, in kept samples."""
    return class_checks.imbalance(class_counts(d), p)


@check("clean", severity=WARNING)
def check_distinct_labels(d: CleanDir, p: Policy) -> CheckResult:
    """No two class names differ only by case or character form ("Cat" and "cat"; an NFC and an
    NFD "café"): likelier one class spelled twice than two."""
    counts = class_counts(d)
    return class_checks.distinct(None if counts is None else list(counts))


@check("clean")
def check_duplicates(d: CleanDir, p: Policy) -> CheckResult:
    """At most max_duplicate_samples kept samples are an exact or near copy of another kept sample.

    Kept samples that are exact or near copies of another kept sample: what pipe clean should
    have removed (a run with --no-near-dedup, a folder another tool or an older pipe wrote)."""
    name = "duplicates"
    if d.rows is None:
        return skip(name, "no readable manifest")
    samples, found = _copies(d, p)
    lines = [f"{samples[j]['where']} ~ {samples[i]['where']} ({how})" for j, (i, how) in sorted(found.same_group.items())]
    return at_most(name, lines, p.max_duplicate_samples, len(samples),
                    "kept samples are exact or near copies of another kept sample",
                    "kept samples are an exact or near copy of another kept sample", candidates_not_confirmed=found.unconfirmed)


@check("clean")
def check_label_conflicts(d: CleanDir, p: Policy) -> CheckResult:
    """At most max_label_conflicts kept samples are an exact or near copy of a sample under another
    label.

    One content kept under two labels: the model is taught both answers."""
    name = "label_conflicts"
    if d.rows is None:
        return skip(name, "no readable manifest")
    samples, found = _copies(d, p)
    lines = [f"{samples[j]['where']} ({samples[j]['label']}) ~ {samples[i]['where']} ({samples[i]['label']}) ({how})"
             for j, (i, how) in sorted(found.other_label.items())]
    return at_most(name, lines, p.max_label_conflicts, len(samples),
                    "kept samples are copies of a kept sample under another label",
                    "kept samples are an exact or near copy of a kept sample under another label",
                   candidates_not_confirmed=found.unconfirmed)


def _copies(d: CleanDir, p: Policy):
    """The kept samples (an image and its caption are one, judged by its image) searched once for
    copies, from the manifest's hashes; near candidates confirmed on the outputs, as pipe clean does."""
    if d.copies is None:
        from functools import lru_cache

        from pipeline.check.leakage import copies, same_views

        samples = _kept_samples(d)
        view = lru_cache(maxsize=1024)(lambda k: _view(d, samples[k]))
        found = copies([s["exact"] for s in samples], [s["phash"] for s in samples],
                       _text_signatures(d, samples), ["kept"] * len(samples),
                       [s["label"] for s in samples], p.near_duplicate_phash_distance,
                       p.near_duplicate_text_similarity,
                       lambda i, j: same_views(view(i), view(j)),
                       lambda i, j: _text_similarity(d, samples[i], samples[j]))
        d.copies = (samples, found)
    return d.copies


def _kept_samples(d: CleanDir) -> list[dict]:
    """One entry per kept sample key: the image row when there is one (its caption does not make
    it another sample), else the text row; the label any of its rows carries."""
    by_key: dict[object, list[dict]] = {}
    for r in d.kept():
        if r.get(NAMES.kind) in (Kind.IMAGE, Kind.TEXT):
            by_key.setdefault(r.get(NAMES.key), []).append(r)
    samples = []
    for rows in by_key.values():
        r = next((x for x in rows if x.get(NAMES.kind) == Kind.IMAGE), rows[0])
        kind, h = r.get(NAMES.kind), r.get(NAMES.content_hash)
        samples.append({
            "where": r.get(NAMES.source), "kind": kind, "output": str(r.get(NAMES.output) or ""),
            "label": next((x.get(NAMES.label) for x in rows if x.get(NAMES.label) is not None), None),
            "exact": f"{kind}:{h}" if h else None, "width": r.get(NAMES.width), "height": r.get(NAMES.height),
            "phash": _int16(r.get(NAMES.phash)) if kind == Kind.IMAGE else None})
    return samples


def _int16(v) -> int | None:
    try:
        return int(v, 16) if isinstance(v, str) else None
    except ValueError:
        return None


def _output(d: CleanDir, s: dict) -> bytes | None:
    return _output_bytes(d.root, s["output"]) if s["output"] else None


def _text_signatures(d: CleanDir, samples: list[dict]) -> list[bytes | None]:
    """The MinHash signature of each text-only sample's output (None for the rest): about a
    millisecond a text, so many texts are signed in worker processes."""
    jobs = [(d.root, s["output"] if s["kind"] == Kind.TEXT else "") for s in samples]
    if sum(bool(rel) for _, rel in jobs) < IN_PROCESS_FILES or d.workers == 1:
        return sign_chunk(jobs)
    from pipeline.core.executor import OrderedPool

    chunks = [jobs[i : i + CHUNK] for i in range(0, len(jobs), CHUNK)]
    pool = OrderedPool(sign_chunk, min(worker_count(d.workers), len(chunks)))
    return [sig for part in pool.map(chunks, on_crash=lambda chunk, e: [None] * len(chunk)) for sig in part]


def sign_chunk(jobs: list[tuple[Folder, str]]) -> list[bytes | None]:
    """MinHash signatures of the UTF-8 texts at ``(folder, rel)`` ("" or unreadable: None); a worker's unit."""
    from pipeline.similarity.minhash import text_signature

    out = []
    for root, rel in jobs:
        data = _output_bytes(root, rel) if rel else None
        try:
            out.append(text_signature(data.decode("utf-8")) if data is not None else None)
        except UnicodeDecodeError:
            out.append(None)
    return out


def _read_text(d: CleanDir, s: dict) -> str | None:
    data = _output(d, s)
    try:
        return data.decode("utf-8") if data is not None else None
    except UnicodeDecodeError:
        return None


def _view(d: CleanDir, s: dict):
    """The kept output's perceptual view (as `pipe clean` compares), None when it cannot be read."""
    import io

    from pipeline.similarity.perceptual import load_view

    data = _output(d, s)
    return (load_view(io.BytesIO(data), s["width"], s["height"], str(d.settings().get("resize_mode") or "pad"))
            if data is not None else None)


def _text_similarity(d: CleanDir, a: dict, b: dict) -> float | None:
    from pipeline.similarity.minhash import jaccard, shingles

    ta, tb = _read_text(d, a), _read_text(d, b)
    return None if ta is None or tb is None else jaccard(shingles(ta), shingles(tb))


def expected_size(declared, p: Policy) -> int | None:
    return p.image_size if p.image_size is not None else declared


@check("clean")
def check_image_size(d: CleanDir, p: Policy) -> CheckResult:
    """Every output image is image_size x image_size pixels (unset: the size pipe clean was given)."""
    declared = d.settings().get("size")
    declared = declared if isinstance(declared, int) and not isinstance(declared, bool) else None
    return image_size(d.images, expected_size(declared, p), "image_size")


def image_size(images: dict[str, ImageFacts], size: int | None, name: str) -> CheckResult:
    if size is None:
        return skip(name, "no image size declared by the folder nor set by the policy (image_size)")
    offenders = [f"{k}: {f.width}x{f.height}" for k, f in images.items() if f.width is not None and (f.width, f.height) != (size, size)]
    offenders += [f"{k}: {f.error}" for k, f in images.items() if f.width is None]
    return verdict(name, offenders, len(images), f"images are not {size}x{size}",
                   f"all {len(images)} images are {size}x{size}", size=size)


@check("clean")
def check_image_mode(d: CleanDir, p: Policy) -> CheckResult:
    """Every image has mode image_mode."""
    return image_mode(d.images, p.image_mode, "image_mode")


def image_mode(images: dict[str, ImageFacts], mode: str, name: str) -> CheckResult:
    offenders = [f"{k}: mode {f.mode}" for k, f in images.items() if f.mode is not None and f.mode != mode]
    return verdict(name, offenders, len(images), f"images are not {mode}", f"all {len(images)} images are {mode}", mode=mode)


@check("clean")
def check_text_encoding(d: CleanDir, p: Policy) -> CheckResult:
    """Every text is valid UTF-8, without BOM, in NFC, with \\n newlines and no control
    characters."""
    return text_encoding(d.texts, "text_encoding")


def text_encoding(texts: dict[str, str | None], name: str) -> CheckResult:
    offenders = [f"{k}: {why}" for k, why in texts.items() if why]
    return verdict(name, offenders, len(texts), "texts are not clean UTF-8",
                   f"all {len(texts)} texts are UTF-8, NFC, without BOM or control characters")


@check("clean")
def check_decodes(d: CleanDir, p: Policy) -> CheckResult:
    """With --deep, every output image decodes completely; skipped without --deep."""
    if not d.deep:
        return skip("decodes", "only headers were read; --deep decodes every image")
    offenders = [f"{k}: {f.error}" for k, f in d.images.items() if f.error]
    return verdict("decodes", offenders, len(d.images), "images do not decode",
                   f"all {len(d.images)} images decode completely")
