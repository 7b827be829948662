"""No secret in anything pipe says or writes: the one scrubber every printer and writer uses.

Where secrets come from: the AWS credential variables, and URLs that carry credentials or a
query (an endpoint ``http://KEY:SECRET@host``, a presigned URL's signature, a Ray address with a
password). Where they would go: an error line (a storage client's message quotes its endpoint),
a warning or log line from a library, the settings a stage writes (report.json, .pipe/state.json,
a run's config.json and checkpoints), a JSON document printed for machines.

Every URL is *parsed* (`urllib.parse`), not matched against a pattern for secrets: its userinfo,
query and fragment are dropped, whatever they hold. Two forms a parser alone misreads are handled
by what the URL grammar says: userinfo may hold a "/" (an AWS secret often does, and
``http://KEY:se/cret@host`` then looks like host ``KEY``, port ``se``), so for a host-based scheme
the authority runs to the last "@" before the query; and a URL may arrive percent-encoded inside
another one (``http%3A%2F%2FKEY%3A...``), so an encoded URL is decoded and scrubbed too. Besides,
the values of the credential variables and of the userinfo of the URL variables (raw, decoded and
encoded) are replaced wherever they appear, however a library chose to print them.

Data is not scrubbed (a caption may quote a URL with a query): only what pipe itself says and the
settings it records.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
import warnings
from typing import Any

MASK = "***"
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
"""Variables whose whole value is a secret."""
URL_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_STS", "RAY_ADDRESS", "HTTPS_PROXY", "HTTP_PROXY",
           "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
"""Variables holding a URL whose userinfo is a secret."""
MIN_SECRET = 6  # a shorter value is replaced nowhere: it would hit ordinary words and paths, and is no secret worth the name
BUCKET_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
"""Schemes whose authority is a bucket (no userinfo in the grammar): their URLs end the authority at "/"."""

# Where a URL starts in free text (what follows is cut by `_url_end` and then parsed)
_START = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
_START_ENCODED = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*%3A%2F%2F", re.IGNORECASE)
_STOP = set(" \t\r\n\"'`<>{}()|\\^")  # characters no URL holds unencoded: the end of one in a sentence


def scrub(text: str) -> str:
    """``text`` with every URL's credentials, query and fragment removed and every known secret
    value masked. Text without either comes back unchanged (the same object's value)."""
    if not text:
        return text
    text = _mask_known(text)
    text = _scrub_urls(text, _START, scrub_url)
    return _scrub_urls(text, _START_ENCODED, _scrub_encoded_url)


def scrub_url(url: str) -> str:
    """One URL without userinfo, query and fragment: ``http://K:s/e@h:1/p?sig=x`` -> ``http://h:1/p``
    (a URL with none of them comes back as it was)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    hier = rest[:min([i for i in (rest.find("?"), rest.find("#")) if i != -1] or [len(rest)])]
    if scheme.lower() not in BUCKET_SCHEMES:
        # a host-based URL: the authority ends at the last "@" before the query, "/" or not (RFC
        # 3986 forbids "/" in userinfo; people put secrets there all the same)
        hier = hier.rpartition("@")[2]
    try:
        parts = urllib.parse.urlsplit(f"{scheme}://{hier}")
    except ValueError:  # (an unbalanced "[" of an IPv6 host): nothing of it is worth keeping
        return f"{scheme}://{MASK}"
    clean = f"{scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
    return url if clean == url else clean


def scrub_json(value: Any) -> Any:
    """A JSON-ready value (dicts, lists, strings, numbers) with every string scrubbed: for the
    settings a stage records and the documents it prints."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_json(v) for v in value]
    return value


def known_secrets() -> list[str]:
    """The secret values of this process's environment, longest first, each in the forms a
    library may print it (as given, percent-decoded, percent-encoded)."""
    found: set[str] = set()
    for name in SECRET_ENV:
        found.add(os.environ.get(name, ""))
    for name in URL_ENV:
        found.update(_userinfo_parts(os.environ.get(name, "")))
    forms = set()
    for value in found:
        for form in (value, urllib.parse.unquote(value), urllib.parse.quote(value, safe=""),
                     urllib.parse.quote_plus(value, safe="")):
            if len(form) >= MIN_SECRET:
                forms.add(form)
    return sorted(forms, key=lambda s: (-len(s), s))


def userinfo(url: str) -> str:
    """The userinfo of ``url`` as `scrub_url` finds it ("" when none): what it removes."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() in BUCKET_SCHEMES:
        return ""
    end = min([i for i in (rest.find("?"), rest.find("#")) if i != -1] or [len(rest)])
    return rest[:end].rpartition("@")[0]


def _userinfo_parts(url: str) -> list[str]:
    """The userinfo of ``url``, whole and as user and password."""
    info = userinfo(url)
    user, _, password = info.partition(":")
    return [info, user, password] if info else []


def _mask_known(text: str) -> str:
    secrets = known_secrets()
    if not secrets:
        return text
    return re.sub("|".join(_any_hex_case(re.escape(s)) for s in secrets), MASK, text)


def _any_hex_case(pattern: str) -> str:
    """A percent escape matched in either case ("%2F" and "%2f": encoders differ)."""
    return re.sub(r"%([0-9A-Fa-f])([0-9A-Fa-f])",
                  lambda m: f"%[{m[1].upper()}{m[1].lower()}][{m[2].upper()}{m[2].lower()}]", pattern)


def _url_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and text[end] not in _STOP:
        end += 1
    while end > start and text[end - 1] in ".,;:!":  # a sentence's punctuation after the URL
        end -= 1
    return end


def _scrub_urls(text: str, start: re.Pattern, fix) -> str:
    out, pos = [], 0
    for m in start.finditer(text):
        if m.start() < pos:
            continue
        end = _url_end(text, m.start())
        out += [text[pos:m.start()], fix(text[m.start():end])]
        pos = end
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _scrub_encoded_url(encoded: str) -> str:
    """A percent-encoded URL scrubbed, given back encoded as it came."""
    decoded = urllib.parse.unquote(encoded)
    clean = scrub_url(decoded)
    return encoded if clean == decoded else urllib.parse.quote(clean, safe="")


# ---------------------------------------------------------------- what libraries print

class _ScrubRecords(logging.Filter):
    """A log record's text scrubbed before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format itself is left to logging
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_installed = False


def install() -> None:
    """Scrub what libraries print on their own (a storage or Ray client's warnings and log lines
    reach stderr through `warnings` and logging's last-resort handler): once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    scrubber = _ScrubRecords()
    for handler in (logging.lastResort, *logging.getLogger().handlers):
        if handler is not None:
            handler.addFilter(scrubber)
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        shown(scrub(str(message)), category, filename, lineno, file, scrub(line) if line else line)

    warnings.showwarning = showwarning
