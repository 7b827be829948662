"""The command line: usage errors are one line and exit 2; help is fast and torch-free."""


import pytest

from pipeline.formats import manifest
from tests.conftest import pipe_in_fresh_interpreter


def test_help_lists_every_command(cli):
    r = cli("--help")
    assert r.exit_code == 0
    for command in ("clean", "shard", "check", "report", "train", "labels", "export", "doctor"):
        assert command in r.stdout


def test_help_names_each_commands_config_table(cli):
    # rich reads "[clean]" as markup and drops it unless escaped: the help must still say it
    for command in ("clean", "shard", "check", "report", "train", "export", "doctor"):
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


@pytest.mark.slow
def test_bad_flag_values_are_one_line(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    for flags in (["--size", "abc"], ["--size", "100000"], ["--resize-mode", "zoom"], ["--quality", "0"], ["--format", "gif"],
                  ["--bogus"]):
        p = pipe_proc("clean", tmp_path / "raw", "-o", tmp_path / "out", *flags)
        assert p.returncode == 2, flags
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "error" in lines[0], (flags, p.stderr)


# What a local run must never import: torch (seconds, and `pipe clean/shard/check` promise not
# to), and the optional extras (Ray, the S3 client), which a machine without them must not need.
# pandas: pyarrow would import it (~1 s) on clean's first conversion only to ask whether our rows
# are a DataFrame; reading the manifest as a DataFrame afterwards still works.
HEAVY = ("torch", "ray", "boto3", "botocore", "s3transfer")
NOT_IMPORTED = {"--help": HEAVY, "clean": HEAVY + ("pandas",), "shard": HEAVY, "check": HEAVY}


def test_help_and_local_stages_import_neither_torch_nor_the_optional_extras(tmp_path):
    for label, words in (("greeting", ("hello there", "good morning")), ("farewell", ("goodbye now", "see you soon"))):
        (tmp_path / "raw" / label).mkdir(parents=True)
        for i, text in enumerate(words):
            (tmp_path / "raw" / label / f"{i}.txt").write_text(text)
    runs = {"--help": ["--help"], "clean": ["clean", tmp_path / "raw", "-o", tmp_path / "clean", "--workers", "1"],
            "shard": ["shard", tmp_path / "clean", "-o", tmp_path / "shards", "--val-fraction", "0"],
            "check": ["check", tmp_path / "shards"]}
    for name, args in runs.items():  # check may fail two texts on its policy (exit 1): not the point here
        p = pipe_in_fresh_interpreter(*args, exit_codes=(None, 0, 1), after=(
            f"bad = [m for m in sys.modules if m.split('.')[0] in {NOT_IMPORTED[name]!r}]\nassert not bad, sorted(bad)"))
        assert p.returncode == 0, (name, p.stderr[-2000:])
    assert len(manifest.read(tmp_path / "clean" / "manifest.parquet")) == 4
    assert (tmp_path / "shards" / "index.json").exists()


def test_pipe_clean_starts_its_workers_fork_server_before_importing_the_cli(tmp_path):
    """The fork server's imports (numpy, the decoders) are the longest part of pipe clean's
    start-up: it must start before this process imports typer, so that the two overlap."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("a short text")
    before = ("import multiprocessing.forkserver as fs\nseen = []\n_start = fs.ensure_running\n"
              "def ensure_running():\n    seen.append('typer' in sys.modules)\n    _start()\n"
              "fs.ensure_running = ensure_running")
    p = pipe_in_fresh_interpreter("clean", tmp_path / "raw", "-o", tmp_path / "clean", "--workers", "1", before=before,
                                  after="assert seen and not seen[0], seen")
    assert p.returncode == 0, p.stderr[-2000:]


def test_only_executor_ray_on_the_command_line_skips_the_local_fork_server():
    """With --executor ray the cluster's workers decode: a local fork server would only idle
    (~0.5 s of CPU), so `main` skips it when the command line asks for Ray. A folder named "ray"
    is not the executor."""
    from pipeline.cli.app import _asks_for_ray

    assert _asks_for_ray(["clean", "raw", "-o", "out", "--executor", "ray"])
    assert _asks_for_ray(["clean", "raw", "--executor=ray", "-o", "out"])
    assert not _asks_for_ray(["clean", "ray", "-o", "out"])
    assert not _asks_for_ray(["clean", "raw", "-o", "ray", "--executor", "local"])


def test_the_console_entry_skips_the_last_garbage_collection():
    # an object in a reference cycle is collected only by the interpreter's last collection: the
    # entry point freezes everything at exit instead (the command is over; ~45 ms of its tail)
    after = ("class Cycle:\n    def __del__(self):\n        print('collected', flush=True)\n"
             "c = Cycle(); c.me = c; del c\n")
    r = pipe_in_fresh_interpreter("--help", after=after)
    assert r.returncode == 0, r.stderr
    assert "collected" not in r.stdout
