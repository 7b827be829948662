"""The data side of skipping bad samples: keys from damaged headers, captions, fillers, the limit."""

import tarfile

import pytest

from pipeline.core.errors import UsageError
from train.data.skips import donors, key_in_header, parse_limit, text_problem


def _header(name: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 3
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def test_a_damaged_sample_is_named_by_its_header_or_its_offset():
    assert key_in_header(_header("cat_01.jpg"), 512) == "cat_01"
    assert key_in_header(bytes(range(256)) * 2, 1536) == "@1536"  # garbage: no name to trust
    assert key_in_header(b"", 0) == "@0"  # nothing left of it (a shard cut short)
    assert key_in_header(_header("we ird.jpg"), 7) == "@7"  # not a key pipe shard writes


def test_captions_must_be_utf8():
    assert text_problem(None) is None and text_problem("naïve ✓".encode()) is None
    assert "not UTF-8" in text_problem(b"ok \xff\xfe")


def test_a_bad_slot_takes_the_nearest_good_sample_before_it_else_after():
    assert donors(5, {0, 2, 3}) == {0: 1, 2: 1, 3: 1}
    assert donors(4, {3}) == {3: 2} and donors(3, {0, 1, 2}) == {0: None, 1: None, 2: None}


@pytest.mark.parametrize("spec,samples,limit", [("0", 1000, 0), ("7", 10, 7), ("0.1%", 5000, 5), ("0.1%", 300, 1),
                                                ("1.5%", 1000, 15), ("0%", 1000, 0), ("100%", 40, 40)])
def test_the_limit_is_a_count_or_a_share_of_the_train_split(spec, samples, limit):
    assert parse_limit(spec, samples) == limit


@pytest.mark.parametrize("spec", ["", "-1", "1e3", "150%", "%", "ten"])
def test_a_limit_that_is_neither_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="--max-skipped"):
        parse_limit(spec, 1000)


