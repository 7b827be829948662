"""The fast validator (fastjsonschema) and the reference (jsonschema) agree on our schemas."""

from __future__ import annotations

import itertools

import pytest

from pipeline.check.validate import each_error, is_valid_fast
from pipeline.core import schemas

ROW = {
    "source": "cats/a.jpg", "key": "cats__a", "kind": "image", "label": "cats", "status": "kept", "reason": None,
    "detail": "", "duplicate_of": None, "output": "data/cats/cats__a.jpg", "caption": "", "bytes": 1234, "sha256": "a" * 64,
    "width": 640, "height": 480, "encoding": None, "encoding_confidence": None, "content_hash": "f" * 32,
    "phash": "0123456789abcdef", "output_width": 64, "output_height": 64, "pixel_sums": [1, 2, 3],
    "pixel_squares": [4, 5, 6],
}
ODD_VALUES = [None, "", "x", "kept", "duplicate", "quarantined", "exact_duplicate", "zero_bytes", 0, -1, 7, 1.5, True,
              "a" * 64, "0123456789abcdef", "cats/a b.jpg", [], {}]


def mutations():
    yield ROW
    for field, value in itertools.product(ROW, ODD_VALUES):
        yield {**ROW, field: value}
    for status, reason, output, dup in itertools.product(["kept", "duplicate", "quarantined"],
                                                         [None, "near_duplicate", "corrupt"], ["", "data/x.jpg"], [None, "b.jpg"]):
        yield {**ROW, "status": status, "reason": reason, "output": output, "duplicate_of": dup}
    row = dict(ROW)
    del row["phash"]
    yield row
    yield {**ROW, "extra": 1}


@pytest.mark.parametrize("doc", list(mutations()), ids=lambda d: "")
def test_manifest_row_verdicts_agree(doc):
    assert is_valid_fast(doc, "manifest_row") == (schemas.errors(doc, "manifest_row") == [])


@pytest.mark.parametrize("doc", [
    {}, {"max_quarantined_fraction": 0.1}, {"max_quarantined_fraction": 2}, {"min_samples_per_class": True},
    {"image_size": 0}, {"classes": ["a", "a"]}, {"classes": ["a", ""]}, {"severity": {"schema": "warning"}},
    {"severity": {"schema": "fatal"}}, {"severity": {"nope": "error"}}, {"near_duplicate_text_similarity": 0},
    {"image_mode": "CMYK"}, {"typo": 1},
], ids=str)
def test_policy_verdicts_agree(doc):
    assert is_valid_fast(doc, "policy") == (schemas.errors(doc, "policy") == [])


def test_each_error_names_the_row_and_field():
    rows = [ROW, {**ROW, "sha256": "nope"}, ROW]
    assert [(i, e.split(":")[0]) for i, e in each_error(rows, "manifest_row")] == [(1, "sha256")]
