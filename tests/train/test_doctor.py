"""`pipe doctor`: verdicts computed from faked facts, and the few facts we can gather for real here."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from pipeline.core import schemas
from tests.conftest import pipe_env
from train import doctor as dr
from train.doctor import GB, GPU, MIB, Facts

H100 = dict(name="NVIDIA H100 80GB HBM3", memory_bytes=85 * GB, capability=(9, 0))


def healthy(**over) -> Facts:
    """A machine where everything fits: 2 NVLinked H100s, CUDA 12.4 torch on a 12.6 driver."""
    f = Facts(python="3.11.7", platform="Linux", torch="2.5.1+cu124", torch_cuda="12.4",
              torch_arch_list=["sm_80", "sm_86", "sm_90"], cuda_available=True, driver="560.35", driver_cuda="12.6",
              cudnn="9.1.0", nccl="2.21.5", gpus=[GPU(0, **H100), GPU(1, **H100)],
              peer_access={"0-1": True, "1-0": True}, topology={"0-1": "NV18", "1-0": "NV18"},
              backends={"gloo": True, "nccl": True, "mpi": False}, shm_total=64 * GB, shm_free=64 * GB, cpus=32,
              port=29500, port_free=True, run_dir="/runs", disk_free=500 * GB, run_dir_writable=True)
    for k, v in over.items():
        setattr(f, k, v)
    return f


def verdicts(f: Facts) -> dict[str, tuple[str, str]]:
    return {ln.name: (ln.verdict, ln.value + " | " + ln.advice) for ln in dr.diagnose(f)}


def test_healthy_machine_is_all_ok():
    v = verdicts(healthy())
    assert {name: verdict for name, (verdict, _) in v.items() if verdict != "ok"} == {}
    assert "NVLink on 1 of 1 pairs" in v["peer access"][1]
    assert dr.exit_code(dr.diagnose(healthy())) == 0


def test_cpu_only_torch_build_is_fine_for_cpu_training():
    f = healthy(torch="2.13.0+cpu", torch_cuda=None, torch_arch_list=[], cuda_available=False, driver=None, driver_cuda=None,
                cudnn=None, nccl=None, gpus=[], peer_access={}, topology={}, backends={"gloo": True, "nccl": False, "mpi": False})
    v = verdicts(f)
    assert v["cuda"][0] == "ok" and "CPU" in v["cuda"][1]
    assert v["nccl"][0] == "ok" and v["backends"][0] == "ok"
    assert dr.exit_code(dr.diagnose(f)) == 0


def test_cuda_build_without_a_driver_warns():
    f = healthy(cuda_available=False, driver=None, driver_cuda=None, gpus=[], peer_access={}, topology={})
    v = verdicts(f)
    assert v["cuda"][0] == "warn" and "no NVIDIA driver" in v["cuda"][1]
    assert v["gpus"][0] == "warn"


def test_driver_too_old_for_the_torch_build_fails():
    f = healthy(driver_cuda="11.8", cuda_available=False, cuda_error="The NVIDIA driver on your system is too old", gpus=[])
    v = verdicts(f)
    assert v["cuda"][0] == "fail"
    assert "upgrade the driver" in v["cuda"][1] and "CUDA 11.x" in v["cuda"][1]
    assert dr.exit_code(dr.diagnose(f)) == 1


def test_driver_older_minor_version_warns():
    assert verdicts(healthy(driver_cuda="12.2"))["cuda"][0] == "warn"


def test_cuda_build_with_driver_but_no_visible_gpu_fails_and_names_the_variable():
    f = healthy(cuda_available=False, gpus=[], env={"CUDA_VISIBLE_DEVICES": ""})
    verdict, text = verdicts(f)["cuda"]
    assert verdict == "fail" and "CUDA_VISIBLE_DEVICES" in text


def test_two_gpus_without_peer_access_warn_and_name_the_pair():
    f = healthy(peer_access={"0-1": False, "1-0": False}, topology={"0-1": "SYS", "1-0": "SYS"})
    verdict, text = verdicts(f)["peer access"]
    assert verdict == "warn"
    assert "0-1 (SYS)" in text and "NCCL_P2P_DISABLE" in text
    assert dr.exit_code(dr.diagnose(f)) == 0  # slower, not broken


def test_gpu_under_16_gb_warns():
    f = healthy(gpus=[GPU(0, "NVIDIA GeForce RTX 3060", 12 * GB, (8, 6))], peer_access={}, topology={})
    verdict, text = verdicts(f)["gpu 0"]
    assert verdict == "warn" and "16 GB" in text and "--grad-checkpoint" in text


def test_mixed_gpus_warn():
    f = healthy(gpus=[GPU(0, **H100), GPU(1, "NVIDIA A100-SXM4-40GB", 40 * GB, (8, 0))])
    assert verdicts(f)["gpus"][0] == "warn"


@pytest.mark.parametrize("arch, verdict", [
    (["sm_50", "sm_60", "sm_70", "sm_80", "sm_90"], "fail"),  # a Blackwell (sm_120) on an older build
    (["sm_80", "sm_90", "compute_90"], "ok"),  # PTX JIT-compiles for newer GPUs
    (["sm_80", "sm_90", "sm_120"], "ok"),
])
def test_gpu_architecture_must_be_in_the_build(arch, verdict):
    f = healthy(torch_arch_list=arch, gpus=[GPU(0, "NVIDIA RTX PRO 6000", 96 * GB, (12, 0))], peer_access={}, topology={})
    assert verdicts(f)["gpu 0"][0] == verdict


def test_sm_86_runs_sm_80_kernels():
    f = healthy(torch_arch_list=["sm_80"], gpus=[GPU(0, "NVIDIA A40", 48 * GB, (8, 6))], peer_access={}, topology={})
    assert verdicts(f)["gpu 0"][0] == "ok"


def test_missing_nccl_with_two_gpus_fails():
    f = healthy(nccl=None, backends={"gloo": True, "nccl": False, "mpi": False})
    v = verdicts(f)
    assert v["nccl"][0] == "fail" and v["backends"][0] == "fail"


@pytest.mark.parametrize("free, verdict", [(64 * MIB, "fail"), (1024 * MIB, "warn"), (16 * GB, "ok")])
def test_dev_shm_size(free, verdict):
    f = healthy(shm_total=free, shm_free=free)
    got, text = verdicts(f)["/dev/shm"]
    assert got == verdict
    if verdict != "ok":
        assert "--shm-size" in text and "--workers 0" in text


def test_small_shm_also_changes_the_worker_advice():
    assert "0 until /dev/shm is larger" in verdicts(healthy(shm_total=64 * MIB, shm_free=64 * MIB))["cpus"][1]


@pytest.mark.parametrize("cpus, gpus, workers", [(2, 0, 1), (1, 0, 0), (32, 2, 8), (16, 8, 1), (64, 4, 8)])
def test_suggested_workers(cpus, gpus, workers):
    f = healthy(cpus=cpus, gpus=[GPU(i, **H100) for i in range(gpus)])
    assert dr.suggested_workers(f) == workers
    assert f"--workers {workers}" in verdicts(f)["cpus"][1]


def test_port_in_use_fails():
    f = healthy(port_free=False, port_error="0.0.0.0 port 29500: Address already in use")
    verdict, text = verdicts(f)["port"]
    assert verdict == "fail" and "--master-port" in text


@pytest.mark.parametrize("free, writable, verdict", [(500 * GB, False, "fail"), (1 * GB, True, "fail"), (10 * GB, True, "warn")])
def test_disk(free, writable, verdict):
    assert verdicts(healthy(disk_free=free, run_dir_writable=writable))["disk"][0] == verdict


def test_no_torch_is_one_fail_line_and_no_gpu_lines():
    v = verdicts(healthy(torch=None, torch_error="ModuleNotFoundError: No module named 'torch'"))
    assert v["torch"][0] == "fail"
    assert "cuda" not in v and "gpu 0" not in v


# ---- real facts, where this machine can give them


def test_port_free_sees_a_listening_socket():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        assert dr.port_free(port)[0] is False
    finally:
        s.close()
    assert dr.port_free(port)[0] is True


def test_parse_nvidia_smi_topology():
    text = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV12\tSYS\tPIX\t0-23\t0\t\tN/A\n"
            "GPU1\tNV12\t X \tSYS\tSYS\t0-23\t0\t\tN/A\n"
            "GPU2\tSYS\tSYS\t X \tSYS\t24-47\t1\t\tN/A\n"
            "NIC0\tPIX\tSYS\tSYS\t X \n\nLegend:\n\n  X    = Self\n")
    topo = dr.parse_topology(text)
    assert topo["0-1"] == "NV12" and topo["1-0"] == "NV12" and topo["0-2"] == "SYS" and topo["2-1"] == "SYS"
    assert len(topo) == 6


def test_disk_facts_use_the_nearest_existing_parent(tmp_path):
    free, writable = dr.disk_facts(tmp_path / "not" / "yet")
    assert free and free > 0 and writable is True


def test_gather_here_and_json_matches_schema(cli, tmp_path):
    r = cli("doctor", "--json", "--run-dir", tmp_path, "--port", "29555")
    doc = json.loads(r.stdout)
    assert schemas.errors(doc, "doctor_report") == []
    assert doc["facts"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["facts"]["cpus"] >= 1
    assert r.exit_code == (0 if doc["ok"] else 1)
    assert doc["ok"] == all(ln["verdict"] != "fail" for ln in doc["lines"])


def test_table_has_a_verdict_per_line(cli, tmp_path):
    r = cli("doctor", "--run-dir", tmp_path)
    for name in ("python", "torch", "/dev/shm", "cpus", "port", "disk"):
        assert name in r.stdout


def test_bad_port_is_usage_error(cli):
    r = cli("doctor", "--port", "70000")
    assert r.exit_code == 2 and "--port" in r.stderr


def test_importing_doctor_does_not_import_torch():
    code = "import sys; import train.doctor, pipeline.cli.doctor; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


def test_config_file_doctor_table(cli, tmp_path):
    cfg = tmp_path / "pipe.toml"
    cfg.write_text(f'[doctor]\nport = 29601\nrun_dir = "{tmp_path}"\n')
    facts = json.loads(cli("doctor", "--config", cfg, "--json").stdout)["facts"]
    assert facts["port"] == 29601 and facts["run_dir"] == str(tmp_path)
    facts = json.loads(cli("doctor", "--config", cfg, "--port", "29602", "--json").stdout)["facts"]
    assert facts["port"] == 29602


def test_doctor_config_keys_match_the_config_schema():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(dr.DoctorConfig)}
    assert set(schemas.load_schema("config")["properties"]["doctor"]["properties"]) == fields
