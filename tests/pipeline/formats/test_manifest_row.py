"""`ManifestRow`: what pipe clean writes to manifest.parquet is what pipe shard reads back."""

import dataclasses

import pyarrow.parquet as pq

from pipeline.formats.manifest import COLUMNS, ManifestWriter
from pipeline.formats.manifest_row import FIELDS, NAMES, ManifestRow
from pipeline.formats.vocabulary import Kind, Reason, Status


def _rows() -> list[ManifestRow]:
    image = ManifestRow(source="cats/a.jpg", key="cats__a", kind=Kind.IMAGE, label="cats", status=Status.KEPT,
                        reason=None, detail="", duplicate_of=None, output="data/cats/cats__a.jpg", caption="",
                        bytes=1234, sha256="ab" * 32, width=640, height=480, encoding=None,
                        encoding_confidence=None, content_hash="c1", phash="00ff00ff00ff00ff")
    dup = dataclasses.replace(image, source="cats/b.jpg", key="cats__b", status=Status.DUPLICATE,
                              reason=Reason.EXACT_DUPLICATE, duplicate_of="cats/a.jpg", output="")
    text = ManifestRow(source="notes.txt", key="notes", kind=Kind.TEXT, label=None, status=Status.QUARANTINED,
                       reason=Reason.GARBLED_TEXT, detail="mojibake", duplicate_of=None, output="", caption="",
                       bytes=10, sha256="cd" * 32, width=None, height=None, encoding="cp1252",
                       encoding_confidence=0.73, content_hash=None, phash=None)
    return [image, dup, text]


def test_rows_read_back_equal_the_rows_written(tmp_path):
    writer = ManifestWriter(tmp_path / "manifest.parquet")
    for r in _rows():
        writer.add(r)
    writer.close()
    table = pq.read_table(tmp_path / "manifest.parquet")
    assert table.schema.equals(COLUMNS) and table.column_names == list(FIELDS)
    back = [ManifestRow.from_dict(d) for d in table.to_pylist()]
    assert back == _rows()
    assert back[1].status is Status.DUPLICATE and back[1].reason is Reason.EXACT_DUPLICATE and back[2].kind is Kind.TEXT


def test_a_hand_made_row_reads_as_it_is_for_the_reader_to_judge():
    r = ManifestRow.from_dict({"source": "x.bin", "kind": "video", "status": "kept"})
    assert r.kind == "video" and r.status is Status.KEPT  # an unknown word stays; pipe shard names it
    assert r.reason is None and r.phash is None  # a column the file lacks reads as None


def test_names_name_the_columns():
    assert [getattr(NAMES, f) for f in FIELDS] == list(FIELDS) == COLUMNS.names
