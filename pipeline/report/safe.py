"""Hostile text made harmless for the page: escaped for HTML and shown as it really is.

File names, labels, captions and reasons' details come from the data. Escaping (`html.escape`
with quotes) stops markup; that is not enough for a reader: a right-to-left override (U+202E)
makes ``gpj.exe`` look like ``exe.jpg``, control characters and zero-width marks hide, and bytes
that were not UTF-8 (kept by Python as lone surrogates) cannot even be written out. Each of these
is shown as a visible escape such as ``\\u202e`` or ``\\xff``, marked so it stands out.
"""

from __future__ import annotations

import html
import re

MAX_CHARS = 300  # longer strings are cut (a 1 MB "file name" must not become a 1 MB page)

# bidi embeddings/overrides/isolates and marks, zero-width and BOM-like characters, C0/C1
# controls (tab and newline stay), lone surrogates (undecodable bytes under surrogateescape)
_HIDDEN = re.compile("[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e"
                     "\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _visible(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # surrogateescape: the original byte
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}"


def text(value, limit: int = MAX_CHARS) -> str:
    """Any value as HTML-safe text: escaped, hidden characters shown, cut at ``limit`` chars."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    s = str(value)
    cut = len(s) > limit
    if cut:
        s = s[:limit]
    out, last = [], 0
    for m in _HIDDEN.finditer(s):
        out.append(html.escape(s[last:m.start()], quote=True))
        out.append(f'<span class="esc">{_visible(m.group())}</span>')
        last = m.end()
    out.append(html.escape(s[last:], quote=True))
    if cut:
        out.append('<span class="esc">…</span>')
    return "".join(out)


def attr(value, limit: int = MAX_CHARS) -> str:
    """A value for inside a quoted attribute (alt, aria-label, title): no markup at all."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    s = str(value)[:limit]
    s = _HIDDEN.sub(lambda m: _visible(m.group()), s)
    return html.escape(s, quote=True)


def num(value, spec: str = ",") -> str:
    """A number for the page, formatted by ``spec`` ("," for thousands, ".2f"...); anything that
    is not one (a manifest's "width" may be any text someone wrote) is shown as escaped text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return html.escape(format(value, spec))
        except ValueError:  # a spec that does not fit the type (",.2f" of an int is fine; "d" of a float is not)
            return html.escape(str(value))
    return text(value, 60)
