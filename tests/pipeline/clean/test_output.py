"""When a rerun takes an input as unchanged (pipeline.clean.output)."""

from pipeline.clean.output import _same_stamp

S = 1_000_000_000


def test_a_local_file_is_unchanged_only_with_the_same_size_and_times_to_the_nanosecond():
    then = (5, 10 * S + 1, 10 * S + 2)
    assert _same_stamp(then, then)
    assert not _same_stamp((5, 10 * S + 2, 10 * S + 2), then)
    assert not _same_stamp((6, 10 * S + 1, 10 * S + 2), then)
    assert not _same_stamp(None, then)


def test_an_object_a_second_apart_is_the_same_time_two_seconds_is_a_change():
    """A listing's time rounded and a header's truncated (rclone) is one object, not a new one."""
    assert _same_stamp((5, 56 * S, 0), (5, 55 * S, 0))
    assert not _same_stamp((5, 57 * S, 0), (5, 55 * S, 0))
    assert not _same_stamp((4, 55 * S, 0), (5, 55 * S, 0))
