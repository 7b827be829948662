"""pipe clean's last phase: every file's output and quarantine copy where its decision says,
stale files swept, report.json, and the manifest last (its presence means the folder is
complete). The files' whole results are read back a part at a time (`Columns.chunks`), so no
run holds them all."""

from __future__ import annotations

import json

from pipeline.clean.output import PARKED
from pipeline.clean.process import output_path
from pipeline.clean.records import Decision, FileResult
from pipeline.clean.report import ReportBuilder, input_location
from pipeline.core.errors import StageFailed
from pipeline.formats.vocabulary import Reason, Status

# Links, FIFOs and unreadable files have nothing (or nothing of ours) to copy into quarantine/.
NO_COPY_REASONS = {Reason.OUTSIDE_ROOT, Reason.UNREADABLE}
# Inputs rejected for their size are not copied again: linked where the storage can (no bytes),
# else left where they are, the manifest row (source, bytes, sha256) their reference.
LINK_ONLY_REASONS = {Reason.TOO_LARGE}


def finalize(cfg, results, decisions, place, extra: dict, timings: dict) -> dict:
    """Outputs moved where their status says, quarantined inputs copied, stale files swept,
    report.json, and the manifest last (``place``: the `pipeline.clean.output.CleanDir`)."""
    from pipeline.clean.columns import REASONS, STATUSES, iter_results, manifest_table
    from pipeline.formats.manifest import ManifestWriter  # pyarrow: only needed now, at the end

    keep_outputs: set[str] = set()
    keep_quarantine: set[str] = set()
    keep_parked: set[str] = set()
    report = ReportBuilder()
    from pipeline.formats.pixels import BEFORE_ENCODING, MANIFEST_KEY

    writer = ManifestWriter(place.manifest_path(), {MANIFEST_KEY: BEFORE_ENCODING.encode()})  # `process._measure_output`
    twins = decisions.twins()  # the sources duplicates name, read from their parts once
    try:
        offset = 0
        for chunk in results.chunks():
            captions: dict[int, str] = {}
            end = offset + chunk.num_rows
            labels = results.labels(offset, end)
            status, reason = decisions.status[offset:end].tolist(), decisions.reason[offset:end].tolist()
            for i, r in enumerate(iter_results(chunk), offset):
                k = i - offset
                r.label, r.caption, r.caption_reason = labels[k], results.caption.get(i), results.caption_reason.get(i)
                d = Decision(STATUSES[status[k]], None if reason[k] < 0 else REASONS[reason[k]])
                cap = _finalize_file(place, r, d, keep_outputs, keep_parked, keep_quarantine)
                if cap:
                    captions[i] = cap
                    decisions.detail[i] = f"{decisions.detail.get(i, '')}: {cap}"
            rows = manifest_table(chunk, offset, results, decisions, captions, twins)
            report.add_table(rows)
            writer.add_table(rows)
            offset += chunk.num_rows
        place.sweep("data", keep_outputs)
        place.sweep("quarantine", keep_quarantine)
        place.sweep(PARKED, keep_parked)
        doc = report.build(cfg.as_dict(), {k: round(v, 3) for k, v in timings.items()},
                           {**_written(extra), "input": input_location(cfg.input, cfg.output)})
        place.finish(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False) + "\n", writer)
    except OSError as e:
        raise StageFailed(f"could not finish writing {place}: {e}") from None
    return doc


def _written(extra: dict) -> dict:
    """report.json's extra sections as JSON can write them: decide's compact ones made whole now."""
    from pipeline.clean.decide import Conflicts

    return {k: list(v) if isinstance(v, Conflicts) else v for k, v in extra.items()}


def _finalize_file(place, r: FileResult, d, keep_outputs: set, keep_parked: set, keep_quarantine: set) -> str:
    """One file's output and quarantine copy where its decision says; its caption file's path
    when it is a kept image with a caption from the labels file (written now), else ""."""
    cap = ""
    if d.status == Status.KEPT and r.caption is not None:  # a caption from the labels file
        cap = output_path(r.source, r.key, "txt")
        place.write_if_changed(cap, r.caption.encode("utf-8"))
        keep_outputs.add(cap)
    if d.status == Status.KEPT:
        keep_outputs.add(r.output)
        place.move(f"{PARKED}/{r.output}", r.output)
    elif r.output:
        keep_parked.add(f"{PARKED}/{r.output}")
        place.move(r.output, f"{PARKED}/{r.output}")
    if d.status == Status.QUARANTINED and d.reason not in NO_COPY_REASONS and r.bytes > 0 and r.sha256:
        rel = f"quarantine/{d.reason}/{r.source}"
        keep_quarantine.add(rel)
        if not place.has(rel, r.bytes):
            try:
                if d.reason in LINK_ONLY_REASONS:
                    if not place.link_input(r.source, rel):
                        keep_quarantine.discard(rel)
                else:
                    place.copy_input(r.source, rel)
            except FileNotFoundError:  # gone since, or a name that is not UTF-8
                keep_quarantine.discard(rel)
    return cap
