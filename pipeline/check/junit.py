"""The `pipe check` report as JUnit XML: one <testcase> per check, so CI systems list them.

Mapping: a violated ``error`` check is a <failure>; a violated ``warning`` passes (the policy
allows it) and says WARNING in <system-out>; a check that did not run is <skipped>. Each folder
checked is one <testsuite>. Text from the data (file names!) may hold characters XML 1.0 cannot
carry; they are written as \\xNN so the file always parses.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline.check.result import ERROR, FAIL, SKIP
from pipeline.core.files import atomic_write_bytes

# Characters outside XML 1.0's Char production (control characters, surrogates, U+FFFE/U+FFFF).
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _set(el: ET.Element, **attrs) -> ET.Element:
    for k, v in attrs.items():
        el.set(k, xml_safe(v))
    return el


def _counts(results) -> dict[str, str]:
    return {
        "tests": str(len(results)),
        "failures": str(sum(r.status == FAIL and r.severity == ERROR for r in results)),
        "errors": "0",
        "skipped": str(sum(r.status == SKIP for r in results)),
        "time": f"{sum(r.seconds for r in results):.3f}",
    }


def build(report) -> ET.Element:
    root = _set(ET.Element("testsuites"), name="pipe check", **_counts(report.results))
    for folder in report.folders:
        suite = _set(ET.SubElement(root, "testsuite"), name=f"pipe check {folder.kind} {folder.path}",
                     **_counts(folder.results))
        props = ET.SubElement(suite, "properties")
        for k, v in (("kind", folder.kind), ("path", str(folder.path)), ("deep", str(report.deep).lower())):
            _set(ET.SubElement(props, "property"), name=k, value=v)
        for r in folder.results:
            _testcase(suite, r, folder.kind)
    return root


def _testcase(suite: ET.Element, r, kind: str) -> None:
    case = _set(ET.SubElement(suite, "testcase"), name=r.name, classname=f"pipe.check.{kind}", time=f"{r.seconds:.3f}")
    detail = "\n".join([*r.examples, json.dumps(r.numbers, sort_keys=True, default=str)])
    if r.status == SKIP:
        _set(ET.SubElement(case, "skipped"), message=r.message)
    elif r.status == FAIL and r.severity == ERROR:
        failure = _set(ET.SubElement(case, "failure"), message=r.message, type=r.name)
        failure.text = xml_safe(detail)
    out = ET.SubElement(case, "system-out")
    prefix = "WARNING (allowed by the policy): " if r.status == FAIL and r.severity != ERROR else ""
    out.text = xml_safe(f"{prefix}{r.message}\n{detail}")


def write(report, path: Path) -> None:
    tree = ET.ElementTree(build(report))
    ET.indent(tree)
    import io

    buf = io.BytesIO()
    tree.write(buf, encoding="UTF-8", xml_declaration=True)
    atomic_write_bytes(path, buf.getvalue() + b"\n")
