"""The hand-written tar parser agrees with Python's tarfile, starts mid-archive, and refuses
damaged headers with a reason that names the member."""

import io
import tarfile

import pytest

from pipeline.formats import tarstream


def archive(members: list[tuple[str, bytes]]) -> bytes:
    """A USTAR archive written by Python's tarfile (an independent writer)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


MEMBERS = [("a.jpg", b"\xff\xd8" + bytes(range(256)) * 3), ("a.cls", b"3"), ("a.json", b"{}"),
           ("b.txt", b""), ("b.cls", b"12"), ("dir/" + "x" * 120 + "/c.png", b"p" * 1000)]  # a long name uses USTAR's prefix


def test_members_match_tarfile_including_prefixed_names():
    data = archive(MEMBERS)
    ours = [(name, bytes(view)) for name, _, view in tarstream.iter_members(data)]
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        theirs = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    assert ours == theirs == MEMBERS


def test_our_writer_round_trips_and_offsets_point_at_headers():
    data = b"".join(tarstream.member(n, d) for n, d in MEMBERS[:5]) + tarstream.END_OF_ARCHIVE
    got = list(tarstream.iter_members(data))
    assert [(n, bytes(v)) for n, _, v in got] == MEMBERS[:5]
    third = got[2][1]  # start mid-archive at a member's header offset
    assert [n for n, _, _ in tarstream.iter_members(data, start=third)] == [n for n, _ in MEMBERS[2:5]]


def test_damaged_header_is_refused_naming_the_member():
    data = bytearray(archive(MEMBERS))
    second = next(at for n, at, _ in tarstream.iter_members(bytes(data)) if n == "a.cls")
    data[second + 136] ^= 0x01  # one bit of the mtime field: still looks like a header
    with pytest.raises(tarstream.TarFormatError, match=r"member a\.cls \(checksum mismatch\)"):
        list(tarstream.iter_members(bytes(data)))


def test_wrong_offset_and_truncation_are_refused():
    data = archive(MEMBERS)
    with pytest.raises(tarstream.TarFormatError, match="no tar header where one was expected"):
        list(tarstream.iter_members(data, start=512))  # inside a.jpg's data
    first_data_end = 512 + len(MEMBERS[0][1])
    with pytest.raises(tarstream.TarFormatError, match="a.jpg runs past the end"):
        list(tarstream.iter_members(data[:first_data_end - 1]))
    with pytest.raises(tarstream.TarFormatError, match="ends inside a tar header, after member a.jpg"):
        list(tarstream.iter_members(data[: tarstream.member_size(len(MEMBERS[0][1])) + 100]))


@pytest.mark.parametrize("name", ["a", "s00001.jpg", "cats__c0.json", "k" * 80 + ".json", "x" * 100])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 123_456_789, 8**11 - 1])
def test_headers_are_byte_for_byte_what_tarfile_writes(name, size):
    """Shards already written must stay byte-identical: the fast header is tarfile's header."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    assert tarstream.header(name, size) == info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


def test_a_size_tar_cannot_hold_and_a_long_name_are_refused():
    with pytest.raises(ValueError, match="overflow"):
        tarstream.header("a.jpg", 8**11)
    with pytest.raises(ValueError, match="longer than"):
        tarstream.header("x" * 101, 1)


def test_many_headers_at_once_are_each_the_one_header():
    """pipe shard makes a shard's headers in one call: every row must be `header`'s bytes."""
    names = ["a", "s00001.jpg", "cats__c0.json", "k" * 80 + ".json", "x" * 100]
    sizes = [0, 1, 511, 512, 8**11 - 1]
    rows = tarstream.headers(names, sizes)
    assert [bytes(r) for r in rows] == [tarstream.header(n, s) for n, s in zip(names, sizes)]
    with pytest.raises(ValueError, match="overflow"):
        tarstream.headers(["a.jpg", "b.jpg"], [1, 8**11])
    with pytest.raises(ValueError, match="longer than"):
        tarstream.headers(["a.jpg", "x" * 101], [1, 1])
