"""Inline SVG charts, each followed by a table of the same numbers.

No script and no external file: a chart is plain SVG markup with a <title> and <desc> (read by
screen readers, shown as a tooltip), and the table says the same thing for anyone who cannot
see the picture or wants the exact numbers. Every label is escaped by `safe`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.report import safe

COLOURS = ["#3367d6", "#e8710a", "#188038", "#c5221f", "#9334e6", "#12b5cb", "#b06000", "#5f6368"]
MAX_BARS = 40
MAX_ROWS = 200  # rows of a table (a dataset of 100,000 classes must not make a 100 MB page)


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(headers: list[str], rows: list[list], cls: str = "", limit: int = MAX_ROWS) -> str:
    """A table of the first ``limit`` rows; a last row says how many more there are."""
    head = "".join(f"<th>{safe.text(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{safe.text(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows[:limit])
    if len(rows) > limit:
        body += f'<tr><td colspan="{len(headers)}" class="muted">… and {len(rows) - limit:,} more</td></tr>'
    c = f' class="{cls}"' if cls else ""
    return f"<table{c}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _frame(title: str, desc: str, width: int, height: int, body: str) -> str:
    return (f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{safe.attr(title)}"><title>{safe.text(title)}</title><desc>{safe.text(desc)}</desc>'
            f"{body}</svg>")


def bars(title: str, labels: Sequence[str], values: Sequence[float | None], unit: str = "") -> str:
    """A horizontal bar chart and its table (the first MAX_BARS bars; the table has them all)."""
    shown = list(zip(labels, values))[:MAX_BARS]
    top = max([v for _, v in shown if v is not None] + [1e-12])
    row, left, w = 18, 170, 560
    body = []
    for i, (label, v) in enumerate(shown):
        y = i * row
        bw = 0 if not v else max(1.0, (w - left - 70) * v / top)
        body.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" class="lab">{safe.text(label, 28)}</text>'
                    f'<rect x="{left}" y="{y + 3}" width="{bw:.1f}" height="{row - 6}" fill="{COLOURS[0]}"/>'
                    f'<text x="{left + bw + 4:.1f}" y="{y + 13}" class="val">{safe.text(_fmt(v))}</text>')
    desc = "; ".join(f"{label}: {_fmt(v)}{unit}" for label, v in shown[:12])
    svg = _frame(title, desc, w, max(row, row * len(shown)), "".join(body))
    tbl = table(["", title], [[label, v] for label, v in zip(labels, values)])
    return f"<figure><figcaption>{safe.text(title)}</figcaption>{svg}{tbl}</figure>"


def lines(title: str, x_name: str, xs: Sequence[float], series: dict[str, list], y_name: str = "") -> str:
    """A line chart of one or more series over the same x values, and its table."""
    w, h, pad_l, pad_b, pad_t = 640, 220, 56, 28, 10
    pts = [v for s in series.values() for v in s if _finite(v)]
    if not xs or not pts:
        return f"<p class=muted>{safe.text(title)}: no data.</p>"
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(pts), max(pts)
    if y0 == y1:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x0 == x1:
        x0, x1 = x0 - 0.5, x1 + 0.5

    def px(x):
        return pad_l + (w - pad_l - 10) * (x - x0) / (x1 - x0)

    def py(y):
        return pad_t + (h - pad_t - pad_b) * (1 - (y - y0) / (y1 - y0))

    body = [f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - 10}" y2="{h - pad_b}" class="axis"/>',
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" class="axis"/>',
            f'<text x="{pad_l - 4}" y="{pad_t + 8}" text-anchor="end" class="val">{_fmt(y1)}</text>',
            f'<text x="{pad_l - 4}" y="{h - pad_b}" text-anchor="end" class="val">{_fmt(y0)}</text>',
            f'<text x="{pad_l}" y="{h - 8}" class="val">{safe.text(x_name)} {_fmt(x0)}</text>',
            f'<text x="{w - 10}" y="{h - 8}" text-anchor="end" class="val">{_fmt(x1)}</text>']
    for i, (name, ys) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys) if _finite(y))
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        body.append(f'<text x="{w - 14}" y="{pad_t + 12 + 12 * i}" text-anchor="end" fill="{colour}" class="val">'
                    f"{safe.text(name)}</text>")
    desc = (f"{', '.join(series)} over {x_name} {_fmt(x0)} to {_fmt(x1)}; {y_name or 'values'} from "
            f"{_fmt(min(pts))} to {_fmt(max(pts))}")
    svg = _frame(title, desc, w, h, "".join(body))
    rows = [[x, *[s[i] if i < len(s) else None for s in series.values()]] for i, x in enumerate(xs)]
    tbl = table([x_name, *series], rows)
    return f"<figure><figcaption>{safe.text(title)}</figcaption>{svg}<details><summary>numbers</summary>{tbl}</details></figure>"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
