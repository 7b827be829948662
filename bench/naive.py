"""The naive ways the benches compare ours against, written once so every bench means the same."""

from __future__ import annotations


def chardet_decode(data: bytes) -> tuple[str | None, str | None]:
    """How most code decodes a file of unknown encoding: ``chardet.detect`` on all of it, then a
    strict decode with its guess. (text or None when it fails, the encoding chardet named)."""
    import chardet

    enc = chardet.detect(data)["encoding"]
    try:
        return (data.decode(enc) if enc else None), enc
    except (UnicodeDecodeError, LookupError):
        return None, enc
