"""--executor: ray without Ray installed is one line saying how to install it, and an unknown one
is refused (that local runs never import Ray: tests/pipeline/cli/test_app.py)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import pipe_env, pipe_in_fresh_interpreter


def test_executor_ray_without_ray_is_one_line_saying_how_to_install_it(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    for cmd in (["clean", tmp_path / "raw", "-o", tmp_path / "out"], ["shard", tmp_path / "clean", "-o", tmp_path / "shards"]):
        # a Ray that cannot be imported, as on a machine without the extra; pipe exits 2
        p = pipe_in_fresh_interpreter(*cmd, "--executor", "ray", before="sys.modules['ray'] = None", exit_codes=(2,))
        assert p.returncode == 0, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "pip install 'pipe-ml[ray]'" in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_executor_is_refused(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    p = pipe_proc("clean", tmp_path / "raw", "-o", tmp_path / "out", "--executor", "dask")
    assert p.returncode == 2 and "--executor must be one of local, ray" in p.stderr


def test_the_toml_config_sets_the_executor_and_its_schema_refuses_others(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    good = tmp_path / "pipe.toml"
    good.write_text('[clean]\nexecutor = "ray"\nray_address = "127.0.0.9:1"\npart_files = 10\n')
    code = ("import sys\nsys.modules['ray'] = None\nfrom pipeline.cli.app import main\n"
            "sys.argv = ['pipe'] + sys.argv[1:]\nmain()\n")
    p = subprocess.run([sys.executable, "-c", code, "clean", str(tmp_path / "raw"), "-o", str(tmp_path / "out"), "--config", str(good)],
                       capture_output=True, text=True, env=pipe_env())
    assert p.returncode == 2 and "pip install 'pipe-ml[ray]'" in p.stderr, p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[shard]\nexecutor = "spark"\n')
    p = pipe_proc("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--config", bad)
    assert p.returncode == 2 and "executor" in p.stderr, p.stderr


# -- the registry, and any stage's parts on any executor ----------------------------------------


def test_executor_choices_and_help_come_from_the_registry(cli):
    from pipeline import executors

    assert tuple(executors.EXECUTORS) == ("local", "ray")
    for command in ("clean", "shard"):
        r = cli(command, "--help")
        text = "".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split())  # the words, as wrapped in rich's boxes
        assert "".join(executors.HELP.split()) in text, r.stdout


def test_the_local_executor_runs_a_fake_stages_parts():
    """A stage it has never heard of: items squared in worker processes (one crashing its worker,
    pinned on that item alone), each part finished where it ran, whole parts with a later step."""
    from pipeline.executors import get
    from tests import fake_stage

    assert fake_stage.run(get("local", workers=2)) == fake_stage.EXPECTED


class _FakeRay:
    """What `cluster_line` asks of Ray: the nodes (a dead one among them) and the address joined."""

    def __init__(self, cpus: list[int], gcs: str = "10.0.0.1:6379"):
        self._nodes = [{"NodeManagerAddress": f"10.0.0.{i + 1}", "Alive": True, "Resources": {"CPU": float(c)}}
                       for i, c in enumerate(cpus)] + [{"NodeManagerAddress": "10.0.9.9", "Alive": False,
                                                        "Resources": {"CPU": 64.0}}]
        self._gcs = gcs

    def nodes(self) -> list[dict]:
        return self._nodes

    def get_runtime_context(self):
        return type("Context", (), {"gcs_address": self._gcs})()


def test_the_ray_cluster_line_names_how_it_was_found_its_address_nodes_and_cpus(monkeypatch):
    """Before the first part a Ray run says which cluster it joined and why (auto may find someone
    else's), its live nodes and CPUs, or that it started a private one (Ray itself is not needed)."""
    from pipeline.executors.ray import MAX_NODES_SHOWN, cluster_line

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_line(_FakeRay([8, 4]), "auto") == (
        "ray: joined the cluster at 10.0.0.1:6379 (--ray-address auto: the one running on this machine; "
        "--ray-address local starts a private one): 2 nodes, 12 CPUs: 10.0.0.1 (8 CPUs), 10.0.0.2 (4 CPUs)")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "(--ray-address auto: RAY_ADDRESS; " in cluster_line(_FakeRay([1]), "auto")
    assert "(--ray-address 10.0.0.1:6379: as given; " in cluster_line(_FakeRay([1]), "10.0.0.1:6379")
    assert cluster_line(_FakeRay([1], gcs="127.0.0.1:5"), "local") == (
        "ray: started a private cluster for this command (--ray-address local; it ends with the command): "
        "1 node, 1 CPU: 10.0.0.1 (1 CPU)")
    many = cluster_line(_FakeRay([2] * (MAX_NODES_SHOWN + 3)), "auto")
    assert f"{MAX_NODES_SHOWN + 3} nodes, {2 * (MAX_NODES_SHOWN + 3)} CPUs: " in many
    assert many.endswith(f"10.0.0.{MAX_NODES_SHOWN} (2 CPUs) and 3 more")
    secret = cluster_line(_FakeRay([1], gcs="ray://user:hunter2@10.0.0.1:10001"), "ray://user:hunter2@10.0.0.1:10001")
    assert "hunter2" not in secret


def test_a_private_ray_cluster_runs_its_parts_as_tasks():
    """Warm workers wait for a next command, which a cluster ending with this one never sees."""
    from pipeline.executors import get

    assert get("ray", address="local", keep_warm=600).keep_warm == 0
    assert get("ray", address="auto", keep_warm=600).keep_warm == 600


def test_a_private_ray_cluster_keeps_its_sockets_paths_short(monkeypatch):
    """Ray makes Unix sockets under its temp dir (107 bytes at most): a TMPDIR too long for them
    sends the private cluster's temp dir to /tmp instead of failing."""
    import tempfile

    from pipeline.executors import ray

    longest = "/" + "d" * (ray.SOCKET_PATH_MAX - ray.RAY_SOCKET_TAIL - 1)
    monkeypatch.setattr(tempfile, "tempdir", longest)
    assert ray.private_root() == longest
    # the longest socket Ray makes there: mkdtemp's name, a session of a 7-digit pid, the object store
    socket = f"{longest}/pipe-ray-abcdefgh/session_2026-12-05_07-59-47_933350_4194304/sockets/plasma_store"
    assert len(socket) == ray.SOCKET_PATH_MAX
    monkeypatch.setattr(tempfile, "tempdir", longest + "d")
    assert ray.private_root() == "/tmp"
