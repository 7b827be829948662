"""The page: facts in, one self-contained HTML document out.

No script, nothing fetched, sections that fold with <details>, charts as inline SVG with tables
beside them. Every value that came from the data, strings and numbers alike, goes through
`safe.text`, `safe.attr` or `safe.num`, and only after its record passed its schema (`records`).
The content-security policy is the second wall if something slipped through anyway: no script,
no fetch, no form, no <base>, and no style but the page's own sheet (allowed by its hash, so an
injected <style> or style="" does nothing). What it cannot forbid is a <meta http-equiv=refresh>
(no policy directive covers navigation): that one is up to the escaping. Nothing varies between
runs (no clock, no random order), so a rerun writes the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

from pipeline.formats.vocabulary import Status
from pipeline.report import charts, safe
from pipeline.report.clean import CleanFacts, Histogram, InputFacts, Item
from pipeline.report.run import MAX_SERIES, RunFacts, pick_ranks
from pipeline.report.shard import ShardFacts

Facts = CleanFacts | ShardFacts | RunFacts  # what report/stage.py gathers for one folder

STYLE = """
body{font-family:"Noto Sans","Noto Sans CJK SC","Noto Sans CJK JP",system-ui,sans-serif;margin:1.5em auto;max-width:1100px;
color:#202124;background:#fff;line-height:1.4;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:2px solid #dadce0;padding-bottom:.2em;margin-top:1.6em}
details{margin:.6em 0;border:1px solid #dadce0;border-radius:6px;padding:.3em .8em}
summary{font-weight:600;cursor:pointer;padding:.2em 0}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #dadce0;padding:.15em .5em;text-align:left;vertical-align:top}
th{background:#f1f3f4}td:not(:first-child){font-variant-numeric:tabular-nums}
.ok{color:#188038;font-weight:700}.bad{color:#c5221f;font-weight:700}.warn{color:#b06000;font-weight:700}
.muted{color:#5f6368}.esc{background:#fce8e6;color:#a50e0e;border-radius:3px;padding:0 .15em;font-family:monospace}
.cards{display:flex;flex-wrap:wrap;gap:.6em;margin:.4em 0;align-items:flex-start}
.card{width:150px;margin:0;font-size:.78em;overflow-wrap:anywhere}
.card img,.ph{width:96px;height:96px;object-fit:contain;background:#f1f3f4;border:1px solid #dadce0;display:block}
.ph{display:flex;align-items:center;justify-content:center;text-align:center;font-size:.85em;color:#5f6368}
pre.snip{white-space:pre-wrap;background:#f8f9fa;border:1px solid #dadce0;padding:.3em;margin:0;max-height:8em;overflow:auto;
font-size:.95em}
.cluster{border-left:3px solid #3367d6;padding-left:.6em;margin:.6em 0}
figure{margin:.8em 0}figure:not(.card)>figcaption{font-weight:600;margin:.2em 0}svg{max-width:100%;height:auto;font-size:12px}
svg .axis{stroke:#5f6368}svg .grid{stroke:#e8eaed}svg .lab,svg .val{fill:#3c4043}
.issues td{vertical-align:middle}.issues img,.issues .ph{width:96px;height:96px;object-fit:contain;background:#f1f3f4;
border:1px solid #dadce0;display:block}.issues .ph{font-size:.7em}
.invalid{color:#a50e0e}
"""
# The page's own style sheet is allowed by its hash: no other <style>, style="" or CSS can act.
CSP = ("default-src 'none'; img-src data:; "
       f"style-src 'sha256-{base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()}'; "
       "base-uri 'none'; form-action 'none'")


def page(folders: Sequence[tuple[str, Facts]], check: dict | None = None) -> str:
    """The whole document: ``folders`` are (kind, facts) in the order they were given; ``check``
    a `pipe check` report (its to_dict()), shown on top."""
    parts = [_head(), "<body><h1>pipe report</h1>", _folders(folders)]
    if check is not None:
        parts.append(_check(check))
    for _kind, facts in folders:
        parts.append(_section(facts))
    parts.append("</body></html>\n")
    return "".join(parts)


def _head() -> str:
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>pipe report</title><style>{STYLE}</style></head>")


def _section(facts: Facts) -> str:
    """The folder's section, by the kind of facts gathered for it."""
    if isinstance(facts, CleanFacts):
        return _clean(facts)
    if isinstance(facts, ShardFacts):
        return _shard(facts)
    return _run(facts)


def _folders(order: Sequence[tuple[str, Facts]]) -> str:
    items = "".join(f"<li>{kind} dir <code>{safe.text(f.path)}</code></li>" for kind, f in order)
    return f"<ul>{items}</ul>"


def _fold(title: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{title}</summary>{body}</details>"


def _counts(name: str, counts: dict[str, int]) -> str:
    items = list(counts.items())
    rows = "".join(f'<tr><td>{safe.text(k or "(none)")}</td><td data-count="{safe.attr(name)}:{safe.attr(k)}">{v:,}</td></tr>'
                   for k, v in items[:charts.MAX_ROWS])
    if len(items) > charts.MAX_ROWS:
        rows += f'<tr><td colspan="2" class="muted">… and {len(items) - charts.MAX_ROWS:,} more</td></tr>'
    return f"<table><thead><tr><th>{safe.text(name)}</th><th>files</th></tr></thead><tbody>{rows}</tbody></table>"


def _problems(problems: list[str]) -> str:
    if not problems:
        return ""
    return "<ul>" + "".join(f'<li class="bad">{safe.text(p)}</li>' for p in problems) + "</ul>"


# -- pipe check -----------------------------------------------------------------------------

_STATUS = {("pass", "error"): ("ok", "ok"), ("pass", "warning"): ("ok", "ok"), ("fail", "error"): ("bad", "FAIL"),
           ("fail", "warning"): ("warn", "warn"), ("skip", "error"): ("muted", "skip"), ("skip", "warning"): ("muted", "skip")}


def _check(report: dict) -> str:
    s = report.get("summary", {})
    ok = report.get("ok")
    head = (f'<p><span class="{"ok" if ok else "bad"}">{"PASSED" if ok else "FAILED"}</span>: '
            f"{safe.num(s.get('passed', 0))} passed, {safe.num(s.get('errors', 0))} failed, "
            f"{safe.num(s.get('warnings', 0))} warnings, {safe.num(s.get('skipped', 0))} skipped "
            f"(exit {safe.num(report.get('exit_code'))})</p>")
    body = [head]
    for folder in report.get("folders", []):
        rows = []
        for r in folder.get("checks", []):
            cls, word = _STATUS.get((r.get("status"), r.get("severity")), ("muted", str(r.get("status"))))
            ex = "".join(f"<li>{safe.text(e)}</li>" for e in r.get("examples") or [])
            rows.append(f"<tr><td>{safe.text(r.get('name'))}</td><td class=\"{cls}\">{safe.text(word)}</td>"
                        f"<td>{safe.text(r.get('severity'))}</td><td>{safe.text(r.get('message'), 600)}"
                        f"{f'<ul>{ex}</ul>' if ex else ''}</td></tr>")
        body.append(f"<h3>{safe.text(folder.get('kind'))} dir <code>{safe.text(folder.get('path'))}</code></h3>"
                    "<table><thead><tr><th>check</th><th>result</th><th>severity</th><th>finding</th></tr></thead>"
                    f"<tbody>{''.join(rows)}</tbody></table>")
    return f"<section><h2>pipe check</h2>{''.join(body)}</section>"


# -- one file -------------------------------------------------------------------------------

def _visual(it: Item) -> str:
    """The preview (a data: URI made by thumbs from decoded pixels), its placeholder, or the snippet."""
    what = f"{it.kind or 'file'} {it.source}" + (f", label {it.label}" if it.label else "")
    if it.thumb is not None and it.thumb.uri.startswith("data:image/jpeg;base64,"):
        return f'<img src="{safe.attr(it.thumb.uri, len(it.thumb.uri))}" alt="{safe.attr("preview of " + what)}">'
    if it.thumb is not None:
        return f'<div class="ph" role="img" aria-label="{safe.attr(it.thumb.why + ": " + what)}">{safe.text(it.thumb.why)}</div>'
    if it.snippet is not None:
        return f"<pre class=\"snip\">{safe.text(it.snippet, 200)}</pre>"
    return ""


def _card(it: Item, show_label: bool = True) -> str:
    if it.invalid:
        return (f'<figure class="card"><figcaption><code>{safe.text(it.source, 120)}</code><br>'
                f'<span class="invalid">manifest row breaks its schema: {safe.text(it.invalid, 240)}; not shown</span>'
                "</figcaption></figure>")
    lines = [f"<code>{safe.text(it.source, 120)}</code>"]
    if show_label and it.label:
        lines.append(f"label <b>{safe.text(it.label, 60)}</b>")
    if it.width and it.height:
        lines.append(f"{safe.num(it.width)}×{safe.num(it.height)}")
    if it.encoding and it.confidence is not None:
        lines.append(f"{safe.text(it.encoding)} ({safe.num(it.confidence, '.2f')})")
    if it.note:
        lines.append(f"<i>{safe.text(it.note)}</i>")
    if it.detail:
        lines.append(f'<span class="muted">{safe.text(it.detail, 240)}</span>')
    return f'<figure class="card">{_visual(it)}<figcaption>{"<br>".join(lines)}</figcaption></figure>'


def _cards(items: list[Item], show_label: bool = True) -> str:
    return '<div class="cards">' + "".join(_card(i, show_label) for i in items) + "</div>" if items else ""


def _more(shown: int, total: int, what: str) -> str:
    return f'<p class="muted">{shown:,} of {total:,} {what} shown.</p>' if total > shown else ""


# -- clean dir ------------------------------------------------------------------------------

def _clean(f: CleanFacts) -> str:
    parts = [f"<section><h2>clean dir <code>{safe.text(f.path)}</code></h2>", _problems(f.problems),
             _fold("Verdict and counts", _clean_counts(f), True)]
    if f.quarantined:
        n = sum(g.count for g in f.quarantined)
        body = "".join(f"<h4>{safe.text(g.name)}: {g.count:,}</h4>{_cards(g.items)}{_more(len(g.items), g.count, 'files')}"
                       for g in f.quarantined)
        parts.append(_fold(f"Quarantined files ({n:,})", body, True))
    if f.clusters:
        parts.append(_fold(f"Duplicate clusters ({f.duplicate_clusters:,})", _clusters(f), True))
    if f.conflicts_total:
        parts.append(_fold(f"Label conflicts ({f.conflicts_total:,})", _conflicts(f), True))
    if f.classes:
        parts.append(_fold(f"Classes ({len(f.classes):,})", _clean_classes(f), True))
    if f.widths is not None:
        parts.append(_fold("Image sizes and aspect ratios", _sizes(f), True))
    if f.encodings or f.garbled or f.repaired:
        parts.append(_fold("Text encodings", _encodings(f), True))
    parts.append("</section>")
    return "".join(parts)


def _clean_counts(f: CleanFacts) -> str:
    kept, dup, q = (f.by_status.get(s, 0) for s in Status)
    verdict = (f'<p><b data-count="files">{f.files:,}</b> files: <span class="ok">{kept:,} kept</span>, '
               f'{dup:,} duplicates, <span class="{"bad" if q else "ok"}">{q:,} quarantined</span>.</p>')
    out = [verdict, _mismatch(f), _input(f.input), '<div class="cards">', _counts("status", f.by_status),
           _counts("kind", f.by_kind)]
    if f.by_reason:
        out.append(_counts("reason", f.by_reason))
    out.append("</div>")
    if f.by_reason:  # the reason table above has the numbers
        out.append(charts.bars("files per reason", list(f.by_reason), list(f.by_reason.values()), with_table=False))
    return "".join(out)


def _input(i: InputFacts) -> str:
    """Where previews of files that only the raw input holds came from, or why they did not."""
    said = ""
    if i.recorded:
        rel = f" (<code>{safe.text(i.from_clean_dir)}</code> from this folder)" if i.from_clean_dir else ""
        said = f"pipe clean read its input at <code>{safe.text(i.recorded)}</code>{rel}"
    out = []
    if i.given is not None:
        moved = f"; {said}, so its files are shown only where their bytes are still those" if i.moved and said else ""
        out.append(f"<p>Files only in the input are previewed from <code>{safe.text(i.given)}</code> (--input){moved}.</p>")
        if i.gone or i.changed:
            out.append(f'<p class="warn">Files shown without a preview because the input is not what pipe clean read: '
                       f"{i.gone:,} gone from it, {i.changed:,} changed since.</p>")
    elif i.needed:
        n = f"{i.needed:,} file{'s' if i.needed != 1 else ''} shown {'are' if i.needed != 1 else 'is'}"
        out.append(f'<p class="muted">{n} only in the input folder, which the page reads only when it is named: '
                   f"add <code>--input DIR</code> to see {'them' if i.needed != 1 else 'it'}"
                   f"{'; ' + said if said else ''}.</p>")
    return "".join(out)


def _mismatch(f: CleanFacts) -> str:
    """The manifest is what the page counts; say so when report.json claims otherwise."""
    r = f.report or {}
    said = {"files": r.get("files"), "status": _nonzero(r.get("by_status")), "reason": _nonzero(r.get("by_reason")),
            "kind": _nonzero(r.get("by_kind"))}  # report.json lists every status, also those of no file
    found = {"files": f.files, "status": f.by_status, "reason": f.by_reason, "kind": f.by_kind}
    off = [k for k, v in said.items() if v is not None and v != found[k]]
    if not off:
        return ""
    return f'<p class="bad">report.json disagrees with manifest.parquet on: {safe.text(", ".join(off))} (the page counts the manifest).</p>'


def _nonzero(counts):
    return {k: v for k, v in counts.items() if v} if isinstance(counts, dict) else counts


def _clusters(f: CleanFacts) -> str:
    out = []
    for c in f.clusters:
        out.append(f'<div class="cluster"><p>{c.size:,} cop{"y" if c.size == 1 else "ies"} merged into '
                   f"<code>{safe.text(c.kept.source)}</code> (kept copy first)</p>"
                   f"{_cards([c.kept, *c.copies])}{_more(len(c.copies), c.size, 'copies')}</div>")
    out.append(_more(len(f.clusters), f.duplicate_clusters, "clusters (the largest)"))
    return "".join(out)


def _conflicts(f: CleanFacts) -> str:
    out = []
    for c in f.conflicts:
        labels = ", ".join(f"{safe.text(k)} ×{safe.num(v)}" for k, v in c["labels"].items())
        if c.get("more_labels"):
            labels += f" and {c['more_labels']:,} more labels"
        out.append(f'<div class="cluster"><p>labels: <b>{labels}</b>; {safe.text(c["action"])}</p>'
                   f"{_cards(c['files'])}{_more(len(c['files']), len(c['files']) + c['more'], 'copies')}</div>")
    out.append(_more(len(f.conflicts), f.conflicts_total, "conflicts"))
    return "".join(out)


def _clean_classes(f: CleanFacts) -> str:
    values = list(f.classes.values())
    nonzero = [v for v in values if v]
    imb = f"{max(nonzero) / min(nonzero):.2f}" if nonzero else "–"
    unit = f.class_unit
    what = " (an image and its caption count once)" if unit == "samples" else ""
    out = [f"<p>Kept {unit} per label{what}; imbalance (largest / smallest class) <b>{imb}</b>.</p>",
           charts.bars(f"kept {unit} per class", [k or "(no label)" for k in f.classes], values)]
    for label, items in f.class_items.items():
        if items:
            out.append(f"<h4>{safe.text(label or '(no label)')}: {f.classes.get(label, 0):,} {unit} kept</h4>"
                       f"{_cards(items, False)}")
    return "".join(out)


def _sizes(f: CleanFacts) -> str:
    return "".join([
        "<p>Every image file as found in the input (before resizing), also the rejected ones whose header gave a size.</p>",
        _hist("image width", f.widths), _hist("image height", f.heights), _hist("aspect ratio (width / height)", f.aspects)])


def _hist(title: str, h: Histogram | None) -> str:
    return charts.bars(title, h.bins, h.counts) if h is not None else ""


def _encodings(f: CleanFacts) -> str:
    out = []
    if f.encodings:
        out.append(charts.table(["encoding", "files", "mean confidence", "lowest confidence"],
                                [[e["encoding"], e["files"], e["mean_confidence"], e["min_confidence"]] for e in f.encodings]))
    if f.encoding_examples:
        out.append("<h4>Texts that were not UTF-8 (as written out)</h4>" + _cards(f.encoding_examples))
    if f.repaired:
        out.append(f"<h4>Texts repaired or noted: {f.repaired.count:,}</h4>{_cards(f.repaired.items)}"
                   f"{_more(len(f.repaired.items), f.repaired.count, 'files')}")
    if f.garbled:
        out.append(f"<h4>Garbled, undecodable or binary texts (quarantined): {f.garbled.count:,}</h4>"
                   f"{_cards(f.garbled.items)}{_more(len(f.garbled.items), f.garbled.count, 'files')}")
    return "".join(out)


# -- shard dir ------------------------------------------------------------------------------

def _shard(f: ShardFacts) -> str:
    parts = [f"<section><h2>shard dir <code>{safe.text(f.path)}</code></h2>", _problems(f.problems)]
    if f.index is None:
        return "".join(parts) + "</section>"
    counts = "".join(f'<tr><td>{safe.text(s)}</td><td data-count="samples:{safe.attr(s)}">{n:,}</td>'
                     f"<td>{f.shards.get(s, 0):,}</td></tr>" for s, n in f.samples.items())
    imb = f"{f.imbalance:.2f}" if f.imbalance is not None else "–"
    head = (f"<table><thead><tr><th>split</th><th>samples</th><th>shards</th></tr></thead><tbody>{counts}</tbody></table>"
            f"<p>{len(f.classes):,} classes; train imbalance (largest / smallest class) <b>{imb}</b>; "
            f"image size {safe.text(f.index.get('image_size'))}.</p>")
    parts.append(_fold("Verdict and counts", head, True))
    splits = list(f.per_class)
    rows = [[c, *[f.per_class[s].get(c, 0) for s in splits]] for c in f.classes]
    body = [charts.table(["class", *splits], rows)]
    if "train" in f.per_class:
        train = f.per_class["train"]
        largest = sorted(f.classes, key=lambda c: (-train.get(c, 0), c))
        body.append(charts.bars("train samples per class", largest, [train.get(c, 0) for c in largest],
                                with_table=False))  # the class table above has the numbers
    for label, items in f.class_items.items():
        if items:
            body.append(f"<h4>{safe.text(label)}</h4>{_cards(items, False)}")
    parts.append(_fold(f"Classes ({len(f.classes):,})", "".join(body), True))
    parts.append("</section>")
    return "".join(parts)


# -- run dir --------------------------------------------------------------------------------

def _run(f: RunFacts) -> str:
    parts = [f"<section><h2>run dir <code>{safe.text(f.path)}</code></h2>", _problems(f.problems)]
    t = f.train
    steps = [r["step"] for r in t]  # gather keeps only rows that keep their schema: a step is an integer
    summary = (f"<p>{f.windows:,} logged windows, {f.ranks:,} rank{'s' if f.ranks != 1 else ''}, "
               f"{len(f.val):,} validations shown, <span class=\"{'bad' if f.drift_total else 'ok'}\">"
               f"{f.drift_total:,} drift alarm{'s' if f.drift_total != 1 else ''}</span>.</p>")
    parts.append(_fold("Verdict and counts", summary, True))
    if t:
        parts.append(_fold("Training", _training(f, steps), True))
    if f.val:
        xs = [r.get("epoch") or r["step"] for r in f.val]
        body = (charts.lines("validation loss", "epoch", xs, {"val loss": [r.get("val_loss") for r in f.val]}, "loss")
                + charts.lines("validation accuracy", "epoch", xs, {"val acc": [r.get("val_acc") for r in f.val]},
                               "accuracy", percent=True))
        matching = {name: [r.get(f"val_{key}") for r in f.val] for key, name in MATCHING if any(f"val_{key}" in r for r in f.val)}
        if matching:  # --objective contrastive: how well images and captions find each other
            body += charts.lines("zero-shot accuracy and recall@K", "epoch", xs, matching, "share", percent=True)
        parts.append(_fold("Validation", body, True))
    if f.drift_total:
        rows = [[d.get("step"), d.get("rank"), d.get("host"), d.get("what"), d.get("message")] for d in f.drift]
        parts.append(_fold(f"Drift alarms ({f.drift_total:,})",
                           charts.table(["step", "rank", "host", "what", "message"], rows)
                           + _more(len(f.drift), f.drift_total, "alarms"), True))
    if f.label_issues is not None and f.objective == "contrastive":
        parts.append(_fold(f"Mismatched image-caption pairs ({f.label_issues_total:,})",
                           _mismatched(f.label_issues, f.label_issues_total), True))
    elif f.label_issues is not None:
        parts.append(_fold(f"Label-issue candidates ({f.label_issues_total:,})", _label_issues(f), True))
    parts.append("</section>")
    return "".join(parts)


def _training(f: RunFacts, steps: list) -> str:
    """Loss, learning rate and data-wait share: the global line and at most a few ranks of many
    (those furthest from the global loss, those waiting most for data), named under the chart."""
    t = f.train
    loss_ranks = pick_ranks(t, "loss_per_rank", "loss", MAX_SERIES - 1)
    loss = {"global": [r.get("loss") for r in t],
            **{f"rank {i}": [_at(r.get("loss_per_rank"), i) for r in t] for i in loss_ranks}}
    wait_ranks = pick_ranks(t, "data_wait_share_per_rank", None, MAX_SERIES)
    wait = {f"rank {i}": [_at(r.get("data_wait_share_per_rank"), i) for r in t] for i in wait_ranks}
    return (charts.lines("training loss per rank", "step", steps, loss, "loss",
                         note=_of_ranks(len(loss_ranks), f.ranks, "furthest from the global loss"))
            + charts.lines("learning rate", "step", steps, {"lr": [r.get("lr") for r in t]}, "lr")
            + charts.lines("data-wait share per rank (time waiting for data / step time)", "step", steps,
                           wait or {"all": [r.get("data_wait_share") for r in t]}, "share", percent=True, from_zero=True,
                           note=_of_ranks(len(wait_ranks), f.ranks, "waiting most for data")))


def _of_ranks(shown: int, ranks: int, which: str) -> str:
    return f"({shown:,} of {ranks:,} ranks: those {which})" if 0 < shown < ranks else ""


def _label_issues(f: RunFacts) -> str:
    """`pipe labels` output: samples whose label is probably wrong, for a person to look at, each
    with its image when a clean dir holding it was given too."""
    issues = f.label_issues or []
    cols = [c for c in ("rank", "key", "source", "split", "given", "suggested", "score") if any(c in r for r in issues)]
    head = "<th>image</th>" + "".join(f"<th>{safe.text(c)}</th>" for c in cols)
    rows = []
    for r in issues:
        it = f.previews.get(str(r.get("key")))
        if it is not None and not it.invalid and (it.thumb is not None or it.snippet is not None):
            visual = _visual(it)
        else:
            why = "no preview: give the clean dir it came from" if not f.previews_from else "no preview: not in the clean dirs given"
            visual = f'<div class="ph" role="img" aria-label="{safe.attr(why)}">{safe.text(why)}</div>'
        cells = "".join(f"<td>{safe.text(charts.fmt(r.get(c)))}</td>" for c in cols)
        rows.append(f"<tr><td>{visual}</td>{cells}</tr>")
    table = f'<table class="issues"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    return table + _more(len(rows), f.label_issues_total, "candidates (lowest rank first)")


MATCHING = (("zeroshot_acc", "zero-shot accuracy"), ("recall_i2t@1", "image->text R@1"), ("recall_i2t@5", "image->text R@5"),
            ("recall_t2i@1", "text->image R@1"), ("recall_t2i@5", "text->image R@5"))


def _mismatched(pairs: list[dict], total: int) -> str:
    """`pipe labels` on a contrastive run: pairs whose caption fits other images better than its own."""
    rows = [[r.get("rank"), r.get("key"), r.get("source"), r.get("split"), r.get("given"), r.get("score")] for r in pairs]
    return (charts.table(["rank", "key", "image", "split", "caption", "score"], rows)
            + _more(len(rows), total, "pairs (most mismatched first)"))


def _at(xs, i):
    return xs[i] if isinstance(xs, list) and i < len(xs) else None
