"""`pipe clean`'s way to its first file (issue 15): what it starts first, what it never imports."""

import subprocess
import sys

from tests.conftest import pipe_env


def test_clean_starts_its_workers_before_the_cli_and_skips_pydantic(tmp_path):
    # start-up (issue 15): the fork server the workers come from is started before typer is
    # imported, and plain values (defaults, decimal numbers) are not coerced through pydantic,
    # whose import was ~0.2 s on the way to the first file
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    code = (
        "import sys\n"
        "from multiprocessing import forkserver\n"
        "from pipeline.cli import app as cli\n"
        "started, typer_then = forkserver.ensure_running, []\n"
        "def ensure_running():\n"
        "    typer_then.append('typer' in sys.modules)\n"
        "    return started()\n"
        "forkserver.ensure_running = ensure_running\n"
        f"sys.argv = ['pipe', 'clean', {str(tmp_path / 'raw')!r}, '-o', {str(tmp_path / 'out')!r}, '--workers', '1', "
        "'--size', '64', '--file-timeout', '30.5', '--json']\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert typer_then and not typer_then[0], 'typer imported before the fork server started'\n"
        "assert 'pydantic' not in sys.modules, 'pydantic imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())
    assert (tmp_path / "out" / "manifest.parquet").exists()


def test_a_value_that_is_no_plain_number_still_gets_typers_message(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    for flag, value, words in (("--size", "abc", "valid integer"), ("--size", "1_024", None),
                               ("--file-timeout", "1e1", None), ("--near-text-jaccard", "x", "valid number")):
        r = cli("clean", tmp_path / "raw", "-o", tmp_path / f"out{flag}{value}", flag, value, "--workers", "1", "--json")
        if words is None:  # typer's own reading of it: accepted
            assert r.exit_code == 0, (flag, value, r.output)
        else:
            assert r.exit_code == 2 and f"Invalid value for '{flag}'" in r.output and words in r.output, (flag, r.output)
