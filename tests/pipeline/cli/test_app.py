"""The command line: usage errors are one line and exit 2; help is fast and torch-free."""

import subprocess
import sys

from tests.conftest import pipe_env


def test_help_lists_every_command(cli):
    r = cli("--help")
    assert r.exit_code == 0
    for command in ("clean", "shard", "check", "report", "train", "labels", "doctor"):
        assert command in r.stdout


def test_help_names_each_commands_config_table(cli):
    # rich reads "[clean]" as markup and drops it unless escaped: the help must still say it
    for command in ("clean", "shard", "check", "report", "train", "doctor"):
        r = cli(command, "--help")
        assert r.exit_code == 0
        assert f"[{command}]" in " ".join(r.stdout.split()), command


def test_missing_input_is_usage_error(cli, tmp_path):
    r = cli("clean", tmp_path / "nope", "-o", tmp_path / "out")
    assert r.exit_code == 2
    assert "input folder not found" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_output_inside_input_is_refused(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    r = cli("clean", tmp_path / "raw", "-o", tmp_path / "raw" / "clean")
    assert r.exit_code == 2
    assert "inside the input" in r.stderr
    assert not (tmp_path / "raw" / "clean").exists()


def test_unwritable_output_is_usage_error(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "file").write_text("x")
    r = cli("clean", tmp_path / "raw", "-o", tmp_path / "file" / "out")
    assert r.exit_code == 2
    assert "output" in r.stderr


def test_bad_flag_values_are_one_line(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    for flags in (["--size", "abc"], ["--size", "100000"], ["--resize-mode", "zoom"], ["--quality", "0"], ["--format", "gif"],
                  ["--bogus"]):
        p = pipe_proc("clean", tmp_path / "raw", "-o", tmp_path / "out", *flags)
        assert p.returncode == 2, flags
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "error" in lines[0], (flags, p.stderr)


def test_help_does_not_import_torch():
    code = "import sys; from pipeline.cli.app import app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


def test_clean_path_does_not_import_torch_or_pandas(tmp_path):
    # pandas: pyarrow would import it (~1 s) on its first conversion only to ask whether our rows
    # are a DataFrame; reading the manifest as a DataFrame afterwards still works
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    code = (
        "import sys; from pipeline.clean import stage as clean; from pipeline.formats import manifest; from pathlib import Path; "
        f"clean.run(clean.CleanConfig(Path({str(tmp_path / 'raw')!r}), Path({str(tmp_path / 'out')!r}), workers=1), show_progress=False); "
        "assert 'torch' not in sys.modules, 'torch imported'; assert 'pandas' not in sys.modules, 'pandas imported'; "
        f"assert len(manifest.read(Path({str(tmp_path / 'out' / 'manifest.parquet')!r}))) == 1"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())
