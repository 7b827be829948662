"""Inline SVG charts, each with a table of the same numbers.

No script and no external file: a chart is plain SVG markup with a <title> and <desc> (read by
screen readers, shown as a tooltip), and the table says the same thing for anyone who cannot
see the picture or wants the exact numbers. Every label and number is escaped by `safe`.

Made to be read off a slide: axes with round ticks and grid lines, a legend whose swatches and
names carry each line's colour (drawn with presentation attributes that no rule of the page's
style sheet touches: one did, and every legend came out grey), percentages where the console
prints them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

from pipeline.report import safe

COLOURS = ["#3367d6", "#e8710a", "#188038", "#c5221f", "#9334e6", "#12b5cb", "#b06000", "#5f6368"]
MAX_BARS = 40
MAX_ROWS = 200  # rows of a table (a dataset of 100,000 classes must not make a 100 MB page)
TICKS = 5  # about this many ticks an axis
MARKERS = 40  # a line of at most this many points has each one marked


def fmt(x, percent: bool = False) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("∞" if x > 0 else "−∞")
    if percent and isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x * 100:.1f}%"
    if isinstance(x, float):
        return f"{x:.4g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(headers: list[str], rows: list[list], cls: str = "", limit: int = MAX_ROWS, percent: Sequence[int] = ()) -> str:
    """A table of the first ``limit`` rows; a last row says how many more there are. Columns
    whose index is in ``percent`` show fractions as percentages."""
    head = "".join(f"<th>{safe.text(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{safe.text(fmt(c, i in percent))}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows[:limit])
    if len(rows) > limit:
        body += f'<tr><td colspan="{len(headers)}" class="muted">… and {len(rows) - limit:,} more</td></tr>'
    c = f' class="{safe.attr(cls)}"' if cls else ""
    return f"<table{c}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _frame(title: str, desc: str, width: int, height: int, body: str) -> str:
    return (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{safe.attr(title)}"><title>{safe.text(title)}</title><desc>{safe.text(desc, 600)}</desc>'
            f"{body}</svg>")


def bars(title: str, labels: Sequence[str], values: Sequence[float | None], unit: str = "",
         with_table: bool = True) -> str:
    """A horizontal bar chart (the first MAX_BARS bars) and, unless a table of the same numbers is
    already beside it (``with_table`` False), its table with them all."""
    shown = [(label, v if _finite(v) else None) for label, v in list(zip(labels, values))[:MAX_BARS]]
    top = max([v for _, v in shown if v is not None] + [1e-12])
    row, left, w = 18, 170, 560
    body = []
    for i, (label, v) in enumerate(shown):
        y = i * row
        bw = 0 if not v else max(1.0, (w - left - 70) * max(v, 0) / top)
        body.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" class="lab">{safe.text(label, 28)}</text>'
                    f'<rect x="{left}" y="{y + 3}" width="{bw:.1f}" height="{row - 6}" fill="{COLOURS[0]}"/>'
                    f'<text x="{left + bw + 4:.1f}" y="{y + 13}" class="val">{safe.text(fmt(v))}</text>')
    desc = "; ".join(f"{label}: {fmt(v)}{unit}" for label, v in shown[:12])
    svg = _frame(title, desc, w, max(row, row * len(shown)), "".join(body))
    tbl = table(["", title], [[label, v] for label, v in zip(labels, values)]) if with_table else ""
    return f"<figure><figcaption>{safe.text(title)}</figcaption>{svg}{tbl}</figure>"


def ticks(lo: float, hi: float, n: int = TICKS, whole: bool = False) -> list[float]:
    """Round values (1, 2, 2.5 or 5 times a power of ten apart; ``whole``: 1 at least) from at or
    below ``lo`` to at or above ``hi``: about ``n`` of them, at least two."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        pad = 1.0 if whole else (abs(lo) * 0.1 or 1.0)
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, n - 1)
    power = 10 ** math.floor(math.log10(raw))
    steps = [m * power for m in (0.5, 1, 2, 2.5, 5, 10, 20)]
    if whole:
        steps = [x for x in steps if x >= 1 and float(x).is_integer()] or [1.0]
    step = next((x for x in steps if _count(lo, hi, x) <= n + 2), steps[-1])
    first = math.floor(lo / step + 1e-9) * step
    out: list[float] = []
    x = first
    while x < hi + step * 0.999 and len(out) < 4 * n:
        out.append(round(x, 12))
        x = first + step * len(out)
    return out if len(out) >= 2 else [first, first + step]


def _count(lo: float, hi: float, step: float) -> int:
    return math.ceil(hi / step - 1e-9) - math.floor(lo / step + 1e-9) + 1


def _tick_label(x: float, step: float, percent: bool) -> str:
    """A tick's value with as many decimals as the step between ticks has (0.25 -> 2, 5 -> 0)."""
    if percent:
        x, step = x * 100, step * 100
    if abs(x) >= 1e9 or step < 1e-4:
        return f"{x:.3g}" + ("%" if percent else "")
    exponent = Decimal(repr(round(step, 10))).normalize().as_tuple().exponent
    decimals = max(0, -exponent) if isinstance(exponent, int) else 0
    return f"{x:,.{decimals}f}" + ("%" if percent else "")


def lines(title: str, x_name: str, xs: Sequence[float], series: dict[str, list], y_name: str = "",
          percent: bool = False, note: str = "", from_zero: bool = False) -> str:
    """A line chart of one or more series over the same x values, and its table; ``percent``:
    the values are fractions, shown as percentages; ``from_zero``: the y axis starts at 0 (a share)."""
    w, h, pad_l, pad_r, pad_b, pad_t = 720, 260, 64, 16, 40, 30
    pts = [v for s in series.values() for v in s if _finite(v)]
    at: list[float | None] = [x if _finite(x) else None for x in xs]
    known = [x for x in at if x is not None]
    if not known or not pts:
        return f'<p class="muted">{safe.text(title)}: no data.</p>'
    yt = ticks(min(min(pts), 0.0) if from_zero else min(pts), max(pts))
    xt = ticks(min(known), max(known), whole=all(float(x).is_integer() for x in known))  # steps, epochs: whole ticks
    y0, y1, x0, x1 = yt[0], yt[-1], xt[0], xt[-1]

    def px(x):
        return pad_l + (w - pad_l - pad_r) * (x - x0) / ((x1 - x0) or 1)

    def py(y):
        return pad_t + (h - pad_t - pad_b) * (1 - (y - y0) / ((y1 - y0) or 1))

    body = []
    ystep, xstep = yt[1] - yt[0], xt[1] - xt[0]
    for y in yt:
        body.append(f'<line x1="{pad_l}" y1="{py(y):.1f}" x2="{w - pad_r}" y2="{py(y):.1f}" class="grid"/>'
                    f'<text x="{pad_l - 6}" y="{py(y) + 4:.1f}" text-anchor="end" class="val">'
                    f"{safe.text(_tick_label(y, ystep, percent))}</text>")
    for x in xt:
        body.append(f'<line x1="{px(x):.1f}" y1="{h - pad_b}" x2="{px(x):.1f}" y2="{h - pad_b + 4}" class="axis"/>'
                    f'<text x="{px(x):.1f}" y="{h - pad_b + 16}" text-anchor="middle" class="val">'
                    f"{safe.text(_tick_label(x, xstep, False))}</text>")
    body.append(f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - pad_r}" y2="{h - pad_b}" class="axis"/>'
                f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" class="axis"/>'
                f'<text x="{(pad_l + w - pad_r) / 2:.0f}" y="{h - 6}" text-anchor="middle" class="lab">{safe.text(x_name)}</text>'
                f'<text x="14" y="{(pad_t + h - pad_b) / 2:.0f}" text-anchor="middle" class="lab" '
                f'transform="rotate(-90 14 {(pad_t + h - pad_b) / 2:.0f})">{safe.text(y_name + (" (%)" if percent else ""))}</text>')
    for i, ys in reversed(list(enumerate(series.values()))):  # the first series (the global one) on top
        colour = COLOURS[i % len(COLOURS)]
        drawn = [(px(x), py(y)) for x, y in zip(at, ys) if x is not None and _finite(y)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if len(drawn) <= MARKERS:  # few points: each one marked
            body.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in drawn)
    body.append(_legend(list(series), pad_l, w - pad_r))
    desc = (f"{', '.join(series)} over {x_name} {fmt(min(known))} to {fmt(max(known))}; {y_name or 'values'} from "
            f"{fmt(min(pts), percent)} to {fmt(max(pts), percent)}")
    svg = _frame(title, desc, w, h, "".join(body))
    rows = [[x, *[s[i] if i < len(s) else None for s in series.values()]] for i, x in enumerate(at)]
    tbl = table([x_name, *series], rows, percent=range(1, len(series) + 1) if percent else ())
    caption = safe.text(title) + (f' <span class="muted">{safe.text(note)}</span>' if note else "")
    return f"<figure><figcaption>{caption}</figcaption>{svg}<details><summary>numbers</summary>{tbl}</details></figure>"


def _legend(names: list[str], left: float, right: float) -> str:
    """One row above the plot: a swatch and the name of each series, both in its colour (the
    ``legend`` class has no rule in the style sheet, so the fill attribute is what shows)."""
    out, x, y = ['<g class="legend">'], left, 14
    for i, name in enumerate(names):
        colour = COLOURS[i % len(COLOURS)]
        label = safe.text(name, 40)
        width = 30 + 7 * min(len(name), 40)
        if x + width > right and x > left:
            break  # no room: the table below names every series
        out.append(f'<line class="swatch" x1="{x:.0f}" y1="{y - 4}" x2="{x + 18:.0f}" y2="{y - 4}" stroke="{colour}" stroke-width="3"/>'
                   f'<text x="{x + 22:.0f}" y="{y}" fill="{colour}" font-weight="600">{label}</text>')
        x += width
    out.append("</g>")
    return "".join(out)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
