"""`--executor ray` on a real 2-node cluster (tests/raycluster.py): the result equals a local
run's, byte for byte, and stays so when a worker process, a node or the driver is killed; with
s3:// folders (a real `rclone serve s3`, tests/s3server.py) the tasks read and write the object
store themselves.

Every run is a real `python -m pipeline` process in the cluster's network namespace, where the
S3 server runs too (this machine's loopback is not the namespace's): the tests see its objects
on disk, where rclone keeps them (``BUCKET`` is a folder there). The cluster and the server are
started once for the module (it costs tens of seconds); the test that kills the worker node
runs last.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.executors.parts import SUFFIX
from tests.conftest import REPO as REPO_ROOT
from tests.conftest import pipe_env
from tests.factories import photo, write
from tests.raycluster import Cluster, Namespace, start_cluster
from tests.s3server import ACCESS_KEY, SECRET_KEY, start_rclone

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]
PART = 3  # files per part: the 36 files below make 12 parts
PARTS = 12
BUCKET = "data"


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Path:
    """The S3 server's objects on disk: ``objects / BUCKET / key``."""
    return tmp_path_factory.mktemp("rclone") / "objects"


@pytest.fixture(scope="module")
def cluster(raw, objects):
    """The 2-node cluster, with an S3 server in its namespace holding a copy of ``raw`` at
    s3://BUCKET/raw (put there before the server starts, so its listings see it)."""
    shutil.copytree(raw, objects / BUCKET / "raw")  # copy2: the same times a listing reports
    ns = Namespace.start()
    try:
        server = start_rclone(objects.parent, netns=ns.prefix())
    except BaseException:
        ns.stop()
        raise
    try:
        c = start_cluster(ns, env=server.env)
    except BaseException:
        server.stop()
        ns.stop()
        raise
    try:
        yield c
    finally:
        server.stop()
        c.stop()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Two classes of photos with an exact and a near copy, texts, a broken file and one large
    photo (a part that takes a while)."""
    root = tmp_path_factory.mktemp("raw")
    for i in range(20):
        photo(root / ("cats" if i % 2 else "dogs") / f"p{i:02d}.jpg", 96, 80, seed=i)
    (root / "cats" / "copy.jpg").write_bytes((root / "cats" / "p01.jpg").read_bytes())
    photo(root / "dogs" / "near.png", 96, 80, seed=2, fmt="PNG")
    for i in range(12):
        write(root / "cats" / f"t{i:02d}.txt", f"a caption number {i} about a cat " * (i + 1))
    write(root / "dogs" / "broken.jpg", b"\xff\xd8\xff\xe0 not really a jpeg")
    photo(root / "dogs" / "big.jpg", 2400, 1800, seed=99)
    return root


@pytest.fixture(scope="module")
def local(raw, tmp_path_factory) -> Path:
    """The local run every Ray run is compared with: clean with 2 workers, then shard."""
    out = tmp_path_factory.mktemp("local")
    _run_local(["clean", raw, "-o", out / "clean", "--size", "64", "--workers", "2", "--json"])
    _run_local(["shard", out / "clean", "-o", out / "shards", "--max-count", "5", "--json"])
    return out


def _run_local(args: list) -> None:
    p = subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True, env=pipe_env(),
                       timeout=300)
    assert p.returncode == 0, p.stderr


def _clean_args(raw: Path, out: Path, cluster: Cluster) -> list:
    return ["clean", raw, "-o", out, "--size", "64", "--executor", "ray", "--ray-address", cluster.address,
            "--part-files", PART, "--json"]


def _files(folder: Path, skip: tuple[str, ...] = (".pipe", "report.json")) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in skip}


def _same_clean(ray_out: Path, local_out: Path) -> None:
    """Same manifest rows and the same output files, byte for byte (report.json holds timings)."""
    import pyarrow.parquet as pq

    assert pq.read_table(ray_out / "manifest.parquet").to_pylist() == pq.read_table(local_out / "manifest.parquet").to_pylist()
    ray_files, local_files = _files(ray_out), _files(local_out)
    assert sorted(ray_files) == sorted(local_files)
    assert ray_files == local_files


# `python -m pipeline ARGS`, saying on stderr each sleep of half a second or more once the command
# is done (in the interpreter's exit handlers)
SAYS_LONG_SLEEPS = """
import runpy, sys, time
_sleep = time.sleep
def sleep(s):
    if s >= 0.5:
        sys.stderr.write(f"slept {s} s\\n")
    _sleep(s)
sys.argv = ["pipe", *sys.argv[1:]]
try:
    runpy.run_module("pipeline", run_name="__main__")
finally:
    time.sleep = sleep
"""


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_nothing_listens_beyond_loopback(cluster):
    interfaces, inside, outside = cluster.listeners()
    assert interfaces == ["lo"]  # the namespace's "all addresses" are loopback
    assert inside and all(a.startswith(("127.", "[::ffff:127.", "*:", "[::]:", "[::1]")) for a in inside), inside
    assert outside == []  # nothing of the cluster listens in the machine's own namespace


def test_clean_and_shard_on_ray_equal_local_and_shard_resumes(cluster, raw, local, tmp_path):
    p = cluster.pipe(_clean_args(raw, tmp_path / "clean", cluster))
    assert p.returncode == 0, p.stderr
    _same_clean(tmp_path / "clean", local / "clean")
    # before the first part, the run said which cluster it joined, once: its address, nodes and CPUs
    assert [ln for ln in p.stderr.splitlines() if "cluster" in ln] == [
        f"ray: joined the cluster at {cluster.address} (--ray-address {cluster.address}: as given; --ray-address "
        "local starts a private one): 2 nodes, 2 CPUs: 127.0.0.2 (1 CPU), 127.0.0.3 (1 CPU)"], p.stderr
    from pipeline.core.schemas import errors

    assert errors(_report(tmp_path / "clean"), "report") == []
    parts = _report(tmp_path / "clean")["parts"]
    assert parts["parts"] == PARTS and parts["redone_parts"] == PARTS and len(parts["runs"]) == PARTS
    assert {r["node"] for r in parts["runs"]} <= {"127.0.0.2", "127.0.0.3"}
    assert all(r["files"] <= PART and r["seconds"] > 0 for r in parts["runs"])

    shard_args = ["shard", tmp_path / "clean", "-o", tmp_path / "shards", "--max-count", "5", "--executor", "ray",
                  "--ray-address", cluster.address, "--json"]
    p = cluster.ns.run([sys.executable, "-c", SAYS_LONG_SLEEPS, *map(str, shard_args)], env=cluster.env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # the command ends its session itself: Ray's exit handler would first sleep 0.5 s for worker logs
    assert "slept" not in p.stderr, p.stderr
    shards = _files(tmp_path / "shards", skip=(".pipe",))
    assert len([n for n in shards if n.endswith(".tar")]) >= 3
    assert shards == _files(local / "shards", skip=(".pipe",))

    # as if killed before the last shard and the index: the rerun keeps the finished shards
    (tmp_path / "shards" / "index.json").unlink()
    (tmp_path / "shards" / "val-000000.tar").unlink()
    p = cluster.pipe(shard_args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["reused_shards"] == len([n for n in shards if n.endswith(".tar")]) - 1
    assert _files(tmp_path / "shards", skip=(".pipe",)) == shards


def test_the_folder_prior_decides_the_same_on_ray_as_locally(cluster, tmp_path):
    """A folder of short captions in one legacy code page, where per file some read in a neighbour
    and the folder prior (on the driver, after the parts) decides them: through Ray the same
    manifest and the same outputs, byte for byte, as a local run."""
    from tests.text_samples import LANGUAGES

    raw = tmp_path / "raw"
    for lang, enc in (("ar", "cp1256"), ("tr", "cp1254")):
        text = LANGUAGES[lang][1]
        captions = [s.strip() + "." for s in text.split(".") if len(s.strip()) > 20]
        captions += sorted({w.strip(".,:!") for w in text.split()} - {""})
        for i, t in enumerate(c for c in captions if not c.isascii() and len(c) > 3):
            write(raw / lang / f"{i:03d}.txt", t.encode(enc))
    _run_local(["clean", raw, "-o", tmp_path / "local", "--workers", "2", "--json"])
    p = cluster.pipe(["clean", raw, "-o", tmp_path / "ray", "--executor", "ray", "--ray-address", cluster.address,
                      "--part-files", PART, "--json"])
    assert p.returncode == 0, p.stderr
    assert _report(tmp_path / "local")["folder_prior"]["files"] > 0  # the case: the prior decided some
    assert _report(tmp_path / "ray")["folder_prior"] == _report(tmp_path / "local")["folder_prior"]
    _same_clean(tmp_path / "ray", tmp_path / "local")


def _wait(what, timeout: float = 120, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _stored(objects: Path, prefix: str) -> Path:
    """Where the server keeps the objects under s3://BUCKET/prefix."""
    return objects / BUCKET / prefix


def test_ray_with_object_storage_killed_driver_reruns_unfinished_parts_and_equals_local(cluster, local, objects):
    """s3:// in and out: the tasks write outputs and part results to the bucket themselves (they
    are there while the driver runs), a killed driver leaves no manifest, the rerun redoes only
    the unfinished parts, and clean then shard give what the local runs gave, byte for byte."""
    args = ["clean", f"s3://{BUCKET}/raw", "-o", f"s3://{BUCKET}/clean", "--size", "64", "--executor", "ray",
            "--ray-address", cluster.address, "--part-files", PART, "--json"]
    out = _stored(objects, "clean")
    parts_dir = out / ".pipe" / "parts"

    def finished() -> list[str]:
        return sorted(n for n in os.listdir(parts_dir) if n.endswith(SUFFIX)) if parts_dir.is_dir() else []

    driver = cluster.driver(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(finished)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    _wait(lambda: not cluster.task_pids("clean_part"), every=0.5)
    time.sleep(1)
    done = finished()
    assert 1 <= len(done) < PARTS, done
    assert not (out / "manifest.parquet").exists()
    assert (out / "data").is_dir()  # the finished parts' outputs, written by the tasks

    p = cluster.pipe(args)
    assert p.returncode == 0, p.stderr
    parts = _report(out)["parts"]
    assert parts["reused"] == done
    assert parts["redone_parts"] == PARTS - len(done) == len(parts["runs"])
    assert {r["node"] for r in parts["runs"]} <= {"127.0.0.2", "127.0.0.3"}
    _same_clean(out, local / "clean")

    s = cluster.pipe(["shard", f"s3://{BUCKET}/clean", "-o", f"s3://{BUCKET}/shards", "--max-count", "5",
                      "--executor", "ray", "--ray-address", cluster.address, "--json"])
    assert s.returncode == 0, s.stderr
    shards = _files(_stored(objects, "shards"), skip=(".pipe",))
    assert shards == _files(local / "shards", skip=(".pipe",))
    summary = json.loads(s.stdout)["parts"]
    tars = len([n for n in shards if n.endswith(".tar")])
    assert summary["parts"] == summary["redone_parts"] == len(summary["runs"]) == tars
    assert all(r["seconds"] > 0 and r["node"] in ("127.0.0.2", "127.0.0.3") for r in summary["runs"])
    said = p.stdout + p.stderr + s.stdout + s.stderr
    written = [*_files(out, skip=()).values(), *shards.values()]
    for secret in (SECRET_KEY, ACCESS_KEY):
        assert secret not in said and not [w for w in written if secret.encode() in w]


def test_a_local_output_no_node_can_see_stops_the_run_in_one_line(cluster, raw, tmp_path):
    """A driver whose CLEAN_DIR is its own (a tmpfs in a mount namespace of its own, as a local
    disk is on a real cluster): the tasks find no marker there and the run stops, saying why."""
    out = tmp_path / "clean"
    out.mkdir()
    cmd = " ".join(["mount -t tmpfs none", str(out), "&& exec", sys.executable, "-m pipeline",
                    *map(str, _clean_args(raw, out, cluster))])
    p = cluster.ns.run(["unshare", "--mount", "--", "sh", "-c", cmd], env=cluster.env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    # one line for the failure, after the one that names the cluster (said before the first part)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("ray: joined the cluster at ") and "shared file system" in lines[1], \
        p.stderr
    assert os.listdir(out) == []  # nothing landed where the driver cannot see it


@pytest.fixture(scope="module")
def slow_raw(tmp_path_factory) -> Path:
    """Parts that surely take a while (large PNGs: no decoding at a fraction of the size, as a
    JPEG's), so a part is still running when a test looks for one: on warm workers the small
    photos of `raw` are done before a 50 ms look finds any."""
    root = tmp_path_factory.mktemp("slow_raw")
    for i in range(3 * PART):
        photo(root / ("cats" if i % 2 else "dogs") / f"big{i:02d}.png", 2000, 1500, seed=100 + i, fmt="PNG")
    return root


def test_a_worker_process_killed_during_a_part_is_retried(cluster, slow_raw, tmp_path):
    driver = cluster.driver(_clean_args(slow_raw, tmp_path / "clean", cluster), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    victim = _wait(lambda: cluster.task_pids("clean_part"), every=0.01)[0]
    os.kill(victim, signal.SIGKILL)
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err
    _run_local(["clean", slow_raw, "-o", tmp_path / "local", "--size", "64", "--workers", "2", "--json"])
    _same_clean(tmp_path / "clean", tmp_path / "local")


def test_a_killed_driver_leaves_no_manifest_and_the_rerun_redoes_only_unfinished_parts(cluster, raw, local, tmp_path):
    out = tmp_path / "clean"
    parts_dir = out / ".pipe" / "parts"
    driver = cluster.driver(_clean_args(raw, out, cluster), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(lambda: parts_dir.is_dir() and any(n.endswith(SUFFIX) for n in os.listdir(parts_dir)))
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert not (out / "manifest.parquet").exists()
    # the dead driver's tasks are ended by Ray; wait until none runs, then count what they left
    _wait(lambda: not cluster.task_pids("clean_part"), every=0.5)
    time.sleep(1)
    finished = sorted(n for n in os.listdir(parts_dir) if n.endswith(SUFFIX))
    assert 1 <= len(finished) < PARTS, finished

    p = cluster.pipe(_clean_args(raw, out, cluster))
    assert p.returncode == 0, p.stderr
    parts = _report(out)["parts"]
    assert parts["reused"] == finished
    assert parts["redone_parts"] == PARTS - len(finished) == len(parts["runs"])
    _same_clean(out, local / "clean")


def test_the_ray_executor_runs_a_fake_stages_parts(cluster):
    """The same stage as tests/pipeline/executors/test_executors.py runs locally: Ray knows it
    only by the functions it is given, and its results equal the local executor's."""
    code = ("import json, sys; from pipeline.executors import get; from tests import fake_stage; "
            "print(json.dumps(fake_stage.run(get('ray', address=sys.argv[1]))))")
    p = cluster.ns.run([sys.executable, "-c", code, cluster.address], env=cluster.env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    from tests import fake_stage

    assert json.loads(p.stdout.strip().splitlines()[-1]) == fake_stage.EXPECTED


def test_ray_address_local_runs_on_a_private_cluster_that_ends_with_the_command(cluster, raw, local, tmp_path,
                                                                                  request):
    """--ray-address local: a cluster of this machine for this command alone (not the one running
    here), said so before the first part; the result equals a local run's, and the command leaves
    neither a process nor a file of that cluster behind."""
    # where the private cluster's temp dir goes (TMPDIR): short, as Ray's socket paths must be
    private_tmp = Path(tempfile.mkdtemp(prefix="pt-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(private_tmp, ignore_errors=True))
    before = len(_warm(cluster))
    args = ["clean", raw, "-o", tmp_path / "clean", "--size", "64", "--executor", "ray", "--ray-address", "local",
            "--part-files", PART, "--json"]
    p = cluster.ns.run([sys.executable, "-m", "pipeline", *map(str, args)], env={**cluster.env, "TMPDIR": str(private_tmp)},
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    _same_clean(tmp_path / "clean", local / "clean")
    said = [ln for ln in p.stderr.splitlines() if "cluster" in ln]
    assert len(said) == 1 and said[0].startswith(
        "ray: started a private cluster for this command (--ray-address local; it ends with the command): 1 node, "), \
        p.stderr
    assert {r["node"] for r in _report(tmp_path / "clean")["parts"]["runs"]} == {"127.0.0.1"}  # not the 2-node cluster
    assert len(_warm(cluster)) == before  # nothing started there
    _wait(lambda: not _processes_naming(str(private_tmp)), timeout=60)
    assert list(private_tmp.iterdir()) == []


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line names ``text`` (a Ray node's processes name its temp dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


# the warm workers of this code on the cluster at argv[1]: what each says of itself (pid, node, parts run)
WARM = "import json, sys; from pipeline.executors.ray import warm_workers; print(json.dumps(warm_workers(sys.argv[1])))"

# the fake stage on Ray (keep_warm argv[2]) in a driver that takes its code version to be argv[3]
# (its own when empty): its results, then its warm workers
FAKE_STAGE = """
import json, sys
from pipeline.executors import get, ray
from tests import fake_stage
if sys.argv[3]:
    ray.code_version = lambda: sys.argv[3]  # as a driver of other code would name its warm workers
result = fake_stage.run(get("ray", address=sys.argv[1], keep_warm=float(sys.argv[2])))
print(json.dumps({"result": result, "warm": ray.warm_workers(sys.argv[1])}))
"""


def _warm(cluster: Cluster) -> dict[str, dict]:
    """This code's warm workers on the cluster now, by name."""
    p = cluster.ns.run([sys.executable, "-c", WARM, cluster.address], env=cluster.env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return {w["name"]: w for w in json.loads(p.stdout.strip().splitlines()[-1])}


def _fake_stage(cluster: Cluster, keep_warm: float = 600, version: str = "", **kw) -> subprocess.Popen:
    return subprocess.Popen([*cluster.ns.prefix(), sys.executable, "-c", FAKE_STAGE, cluster.address, str(keep_warm), version],
                            env=cluster.env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _fake_stage_result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    from tests import fake_stage

    got = json.loads(out.strip().splitlines()[-1])
    assert got["result"] == fake_stage.EXPECTED
    return {w["name"]: w for w in got["warm"]}


def _pids(warm: dict[str, dict]) -> dict[str, int]:
    return {name: w["pid"] for name, w in warm.items()}


def _parts(warm: dict[str, dict]) -> int:
    return sum(w["parts"] for w in warm.values())


def test_the_next_command_runs_on_the_warm_workers_the_last_one_left(cluster, raw, local, tmp_path):
    """One warm worker per CPU (a node each here); shard's parts run in the same processes as
    clean's, which were already warm from the tests before."""
    p = cluster.pipe(_clean_args(raw, tmp_path / "clean", cluster))
    assert p.returncode == 0, p.stderr
    after_clean = _warm(cluster)
    assert sorted(w["node"] for w in after_clean.values()) == ["127.0.0.2", "127.0.0.3"]
    p = cluster.pipe(["shard", tmp_path / "clean", "-o", tmp_path / "shards", "--max-count", "5", "--executor", "ray",
                      "--ray-address", cluster.address, "--json"])
    assert p.returncode == 0, p.stderr
    assert _files(tmp_path / "shards", skip=(".pipe",)) == _files(local / "shards", skip=(".pipe",))
    after_shard = _warm(cluster)
    assert _pids(after_shard) == _pids(after_clean)
    assert _parts(after_shard) - _parts(after_clean) == json.loads(p.stdout)["parts"]["redone_parts"] > 0

    # another clean, into another folder at another size: the item pools' processes are the same too
    # (settings travel with the items), and what they write is what a local run of it writes
    assert all(w["item_pool"] for w in after_clean.values())
    args = _clean_args(raw, tmp_path / "clean48", cluster)
    args[args.index("--size") + 1] = "48"
    p = cluster.pipe(args)
    assert p.returncode == 0, p.stderr
    after = _warm(cluster)
    assert {n: w["item_pool"] for n, w in after.items()} == {n: w["item_pool"] for n, w in after_clean.items()}
    _run_local(["clean", raw, "-o", tmp_path / "local48", "--size", "48", "--workers", "2", "--json"])
    _same_clean(tmp_path / "clean48", tmp_path / "local48")


def test_two_drivers_at_once_share_the_warm_workers(cluster):
    """Two runs of the fake stage at the same time (an item that kills its worker included): both
    get the local executor's results, on the same warm workers, 8 parts each."""
    before = _fake_stage_result(_fake_stage(cluster))  # (the workers exist, whatever ran before)
    both = [_fake_stage(cluster), _fake_stage(cluster)]
    after = [_fake_stage_result(proc) for proc in both][-1]
    assert _pids(after) == _pids(before)
    assert _parts(after) - _parts(before) == 2 * 8


def test_keep_warm_0_runs_parts_as_tasks_and_leaves_the_warm_workers_alone(cluster):
    before = _warm(cluster)
    assert before
    p = _fake_stage(cluster, keep_warm=0)
    _fake_stage_result(p)
    assert _warm(cluster) == before  # the same workers, no part more


def test_a_driver_of_other_code_starts_warm_workers_of_its_own(cluster):
    """Warm workers are named by pipe's code version: a driver whose code differs never gets
    workers that imported this code; they end after their own idle time (2 s here)."""
    before = _warm(cluster)
    assert before
    other = _fake_stage_result(_fake_stage(cluster, keep_warm=2, version="0ther0ther0ther0"))
    assert len(other) == len(before) and all("-0ther0ther0ther0-" in name for name in other)
    assert not set(_pids(other).values()) & set(_pids(before).values())
    assert _parts(other) == 8
    assert _warm(cluster) == before
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in _pids(other).values()), timeout=60, every=0.5)


def test_code_version_follows_the_source():
    """The version in the warm workers' names changes with any byte of the pipeline package."""
    import pipeline
    from pipeline.executors import ray as ray_executor

    ray_executor.code_version.cache_clear()
    try:
        v = ray_executor.code_version()
        assert v == ray_executor.code_version() and len(v) == 16
        tree = Path(pipeline.__file__).parent
        copy = Path(shutil.copytree(tree, Path(os.environ.get("TMPDIR", "/tmp")) / f"pipe-src-{os.getpid()}"))
        try:
            pipeline.__file__ = str(copy / "__init__.py")
            ray_executor.code_version.cache_clear()
            assert ray_executor.code_version() == v  # the same bytes elsewhere: the same code
            (copy / "executors" / "local.py").write_text((copy / "executors" / "local.py").read_text() + "\n# changed\n")
            ray_executor.code_version.cache_clear()
            assert ray_executor.code_version() != v
        finally:
            pipeline.__file__ = str(tree / "__init__.py")
            shutil.rmtree(copy)
    finally:
        ray_executor.code_version.cache_clear()


# a driver that runs one slow whole part (fake_stage.slow: argv[3] seconds, then the file argv[2]) on Ray
SLOW_PART = """
import sys
from pipeline.executors import get
from tests import fake_stage
get("ray", address=sys.argv[1]).run_parts(fake_stage.slow, [(sys.argv[2], float(sys.argv[3]))], lambda *a: None)
"""


def test_a_part_whose_driver_was_killed_is_not_left_running(cluster, tmp_path):
    """A warm worker is no dead job's worker: killed, the driver's running part ends with it (its
    warm worker ends), as Ray ends a dead job's tasks; it never finishes its work."""
    marker = tmp_path / "finished"
    driver = subprocess.Popen([*cluster.ns.prefix(), sys.executable, "-c", SLOW_PART, cluster.address, str(marker), "8"],
                              env=cluster.env, cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    running = _wait(lambda: cluster.task_pids("slow"))
    started = time.monotonic()
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in running), timeout=20, every=0.2)
    assert time.monotonic() - started < 8
    time.sleep(max(0.0, started + 10 - time.monotonic()))  # past the part's 8 s
    assert not marker.exists()


def test_warm_workers_end_themselves_after_their_idle_time(cluster, raw, tmp_path):
    """A command with --ray-keep-warm 1 uses the warm workers and leaves them 1 s of idle time:
    then they end themselves (the cluster is never held for good); the next command starts new ones."""
    before = _warm(cluster)
    assert before
    p = cluster.pipe([*_clean_args(raw, tmp_path / "clean", cluster), "--ray-keep-warm", "1"])
    assert p.returncode == 0, p.stderr
    _wait(lambda: _warm(cluster) == {}, timeout=60, every=0.5)
    assert not any(Path(f"/proc/{pid}").exists() for pid in _pids(before).values())


# a driver of its own holding the CPU of the node at IP argv[2] with one task, until it is killed
HOLD_NODE = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
hold = ray.remote(num_cpus=1, resources={f"node:{sys.argv[2]}": 0.001})(lambda: time.sleep(3600))
ray.get(hold.remote())
"""


def test_the_worker_node_killed_mid_run_the_run_completes(cluster, raw, local, tmp_path):
    # the head's CPU is held first, so the run's parts go to the worker node (the head, warmed up
    # first, could otherwise finish all of this small run before the worker node takes a part)
    holder = subprocess.Popen([*cluster.ns.prefix(), sys.executable, "-c", HOLD_NODE, cluster.address, cluster.head.ip],
                              env=cluster.env, cwd=REPO_ROOT, start_new_session=True)
    try:
        _wait(lambda: cluster.task_pids("<lambda>", cluster.head))
        driver = cluster.driver(_clean_args(raw, tmp_path / "clean", cluster), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait(lambda: cluster.task_pids("clean_part", cluster.worker))
        cluster.worker.kill()  # the last test of the module: the head alone finishes the run (and nothing after it)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # its job ends, and Ray gives the head's CPU back
        holder.wait()
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err
    _same_clean(tmp_path / "clean", local / "clean")
    assert {r["node"] for r in _report(tmp_path / "clean")["parts"]["runs"]} <= {"127.0.0.2", "127.0.0.3"}
