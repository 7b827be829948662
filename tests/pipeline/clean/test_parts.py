"""Parts: the planner covers every candidate exactly once, in order, the same way every time;
a part's results file is the part's, whole, and a re-run finds it under the same name."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pipeline.clean import parts
from pipeline.clean.discover import Candidate
from pipeline.clean.records import FileResult
from pipeline.formats.vocabulary import Kind, Reason


def _cands(n: int, tag: str = "") -> list[Candidate]:
    return [Candidate(f"c/{i:05d}{tag}.jpg", f"/raw/c/{i:05d}.jpg", Kind.IMAGE, "jpeg", key=f"k{i}") for i in range(n)]


@given(st.integers(0, 300), st.integers(1, 40))
def test_plan_names_are_deterministic_unique_and_sort_in_part_order(n, max_files):
    cands = _cands(n)
    plan = parts.plan(cands, {"size": 64}, max_files)
    again = parts.plan(_cands(n), {"size": 64}, max_files)
    assert [p.name for p in plan] == [p.name for p in again]
    assert [p.name for p in plan] == sorted(p.name for p in plan)
    assert len({p.name for p in plan}) == len(plan)
    assert sum(len(p) for p in plan) == n


def test_a_part_whose_files_or_settings_change_gets_another_name():
    base = parts.plan(_cands(30), {"size": 64}, 10)
    renamed = _cands(30)
    renamed[15] = Candidate("c/other.jpg", "/raw/c/other.jpg", Kind.IMAGE, "jpeg", key="k15")
    changed = parts.plan(renamed, {"size": 64}, 10)
    assert [a.name == b.name for a, b in zip(base, changed)] == [True, False, True]
    assert all(a.name != b.name for a, b in zip(base, parts.plan(_cands(30), {"size": 128}, 10)))


def test_results_file_round_trips_and_a_short_one_is_not_a_finished_part(tmp_path: Path):
    cands = _cands(3)
    (p,) = parts.plan(cands, {}, 10)
    results = [FileResult(c.source, c.key, c.kind, bytes=7, sha256="ab") for c in cands]
    results[1].reason = Reason.CORRUPT
    assert parts.read_results(tmp_path, p) is None
    parts.write_results(tmp_path, p, results)
    first = (tmp_path / parts.PARTS_DIR / p.name).read_bytes()
    assert parts.read_results(tmp_path, p) == results
    parts.write_results(tmp_path, p, results)  # a retried part: the same bytes
    assert (tmp_path / parts.PARTS_DIR / p.name).read_bytes() == first
    (tmp_path / parts.PARTS_DIR / p.name).write_bytes(first[: len(first) // 2])  # cut short
    assert parts.read_results(tmp_path, p) is None


def test_the_driver_reads_only_the_columns_it_asks_for(tmp_path: Path):
    cands = _cands(3)
    (p,) = parts.plan(cands, {}, 10)
    parts.write_results(tmp_path, p, [FileResult(c.source, c.key, c.kind, sha256="ab" * 32) for c in cands])
    table = parts.read_table(tmp_path, p, ["source", "kind"])
    assert table.column_names == ["source", "kind"]
    assert table.column("source").to_pylist() == [c.source for c in cands]


def test_results_of_an_earlier_pipe_are_not_read_and_their_part_is_redone(tmp_path: Path):
    """pipe before 0.x wrote a part's results as JSON lines (``.jsonl``): a rerun by this pipe
    must neither misread them nor take them for a finished part, and sweeps them away."""
    cands = _cands(3)
    (p,) = parts.plan(cands, {}, 10)
    folder = tmp_path / parts.PARTS_DIR
    folder.mkdir(parents=True)
    old = folder / p.name.replace(parts.SUFFIX, ".jsonl")
    old.write_text("".join(FileResult(c.source, c.key, c.kind).to_json() + "\n" for c in cands))
    assert parts.read_results(tmp_path, p) is None
    (folder / p.name).write_bytes(old.read_bytes())  # JSON lines under this pipe's name: not a results file either
    assert parts.read_results(tmp_path, p) is None
    (folder / p.name).unlink()
    parts.sweep(tmp_path, [p])
    assert not old.exists()


def test_sweep_removes_only_results_of_other_plans(tmp_path: Path):
    plan = parts.plan(_cands(20), {}, 10)
    for p in plan:
        parts.write_results(tmp_path, p, [])
    stale = tmp_path / parts.PARTS_DIR / "000009.0123456789abcdef.jsonl"
    stale.write_text("")
    parts.sweep(tmp_path, plan)
    assert sorted(x.name for x in (tmp_path / parts.PARTS_DIR).iterdir()) == [p.name for p in plan]


def test_progress_across_the_cluster_says_parts_done_files_per_second_and_time_left(capsys):
    from pipeline.executors.ray import PartsLine  # (Ray itself is not imported)

    line = PartsLine(parts=3, files=30, enabled=True)
    line.EVERY_S = 0.0  # a line for every part here, to see each
    for _ in range(3):
        line.part_done(10)
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["ray: 1/3 parts done", "ray: 2/3 parts done", "ray: 3/3 parts done"]
    assert "files/s" in lines[0] and "left" in lines[0] and "left" not in lines[-1]
    quiet = PartsLine(parts=3, files=30, enabled=False)
    quiet.part_done(10)
    assert capsys.readouterr().err == ""
