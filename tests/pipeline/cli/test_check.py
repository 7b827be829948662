"""`pipe check`'s table on the terminal: names from the data in it are printed inert (issue 24, item 10)."""

from __future__ import annotations

from tests.clean_dirs import Spec, make_clean_dir

HOSTILE = ["cat\x1b[31mRED\x1b[0m", "dog\x1b]0;pwned\x07", "fox\u202eeulb"]


def test_a_clean_dir_named_and_labelled_with_escapes_is_checked_without_one_reaching_the_terminal(cli, tmp_path):
    """Class names and the folder's own name hold ESC, BEL and a bidi override (the folder name is
    the table's title; the classes appear in findings): all come out escaped, markup-free."""
    specs = [Spec(f"k{i:03d}", HOSTILE[i % 3] if i < 30 else HOSTILE[0], seed=i, size=16) for i in range(40)]
    folder = make_clean_dir(tmp_path / "clean\x1b[2J[bold]", specs)
    r = cli("check", folder)
    assert r.exit_code in (0, 1), r.output
    assert not any(c in r.output for c in ("\x1b", "\x07", "\u202e"))
    assert "clean\\x1b[2J[bold]" in "".join(r.stdout.split())
