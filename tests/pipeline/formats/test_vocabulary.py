"""The vocabulary's enums write exactly their plain words wherever pipe writes them (the
manifest, report.json, the journal, quarantine/<reason>/ folder names), so files stay the same."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.formats.vocabulary import Kind, Reason, Status


def test_members_print_and_format_as_their_word():
    # %-formatting is one of the ways under test, not a style choice
    assert str(Status.KEPT) == "kept" and f"{Reason.TRUNCATED}" == "truncated" and "%s" % Kind.IMAGE == "image"  # noqa: UP031
    assert f"quarantine/{Reason.OUTSIDE_ROOT}/a.jpg" == "quarantine/outside_root/a.jpg"
    assert f"{Status.KEPT:>6}" == "  kept"


def test_members_are_interchangeable_with_words_read_back_from_disk():
    assert Status.KEPT == "kept" and "kept" in {Status.KEPT} and Status.KEPT in {"kept"}
    assert {Reason.CORRUPT: 1}["corrupt"] == 1
    assert Reason("timeout") is Reason.TIMEOUT


def test_json_writes_the_word():
    doc = {Status.DUPLICATE: [Reason.NEAR_DUPLICATE, Kind.TEXT]}
    expected = '{"duplicate": ["near_duplicate", "text"]}'
    assert json.dumps(doc) == expected
    assert json.dumps(doc, indent=2) == json.dumps({"duplicate": ["near_duplicate", "text"]}, indent=2)


def test_parquet_holds_the_same_bytes_as_plain_strings(tmp_path):
    schema = pa.schema([("status", pa.string()), ("reason", pa.string())])
    for name, rows in (("enum", [{"status": Status.QUARANTINED, "reason": Reason.TOO_SMALL}]),
                       ("plain", [{"status": "quarantined", "reason": "too_small"}])):
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / f"{name}.parquet", compression="zstd")
    assert (tmp_path / "enum.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()


def test_every_reason_is_described():
    assert all(r.description and r.description != r.value for r in Reason)
