"""Doctor's checks on hand-built facts, and its collectors on fakes of the same shape as the real things."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hangwatch.analyse.doctor import checks as dc
from hangwatch.analyse.doctor import coverage as cov
from hangwatch.analyse.doctor import nccl as nccl_checks
from hangwatch.collect.host import checkpoint_size
from hangwatch.collect.nvml import read_inventory
from hangwatch.collect.pyenv import interpreter_of
from hangwatch.collect.pyenv import quick_env
from hangwatch.engines import registry
from hangwatch.model.doctor import CheckpointFacts
from hangwatch.model.doctor import Coverage
from hangwatch.model.doctor import DeviceHolder
from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import ModuleCoverage
from hangwatch.model.doctor import PortFacts
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.model.doctor import Status
from hangwatch.model.samples import GpuProcessMemory

GiB, MiB = 2**30, 2**20
H100 = GpuFacts(0, "NVIDIA H100", (9, 0), 1 * GiB, 80 * GiB, 0.0, nvlinks=18)
RTX6000 = [GpuFacts(i, "NVIDIA RTX PRO 6000", (12, 0), 1 * GiB, 96 * GiB, 0.0, nvlinks=0) for i in range(2)]


@pytest.mark.parametrize(
    ("total", "free", "status"),
    [
        (64 * MiB, 60 * MiB, Status.FAIL),
        (512 * MiB, 500 * MiB, Status.WARN),
        (16 * GiB, 15 * GiB, Status.PASS),
    ],
)
def test_shm(total, free, status):
    check = dc.check_shm(HostFacts(shm_total_bytes=total, shm_free_bytes=free))
    assert check.status is status
    if status is not Status.PASS:
        assert "--shm-size" in (check.fix or "")


def _nccl(env, command=(), gpus=(H100,), links=(), nccl=None):
    inventory = GpuInventory(gpus=tuple(gpus), links=tuple(links))
    host = HostFacts(net_interfaces=("eth0", "lo"))
    pyenv = PyEnvFacts("python", nccl_version=nccl)
    return nccl_checks.check_nccl_env(
        env, command=command, gpus=list(gpus), inventory=inventory, host=host, pyenv=pyenv
    )


def test_nccl_socket_interface_that_does_not_exist():
    check = _nccl({"NCCL_SOCKET_IFNAME": "ib0"})
    assert check.status is Status.FAIL
    assert "matches no interface" in check.summary
    assert _nccl({"NCCL_SOCKET_IFNAME": "^docker,lo"}).status is Status.PASS
    assert _nccl({"NCCL_SOCKET_IFNAME": "=eth0"}).status is Status.PASS


def test_nccl_contradictions():
    check = _nccl({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"})
    assert check.status is Status.WARN and "contradict" in check.summary
    assert _nccl({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}).status is Status.WARN


def test_blackwell_workstation_tensor_parallel_p2p_hang():
    cmd = ("vllm", "serve", "m", "--tensor-parallel-size", "2")
    check = _nccl({}, cmd, RTX6000, links=[(0, 1, "PHB")], nccl="2.27.3")
    assert check.status is Status.WARN
    assert "nccl#1999" in " ".join(check.evidence)
    assert "NCCL_P2P_DISABLE=1" in (check.fix or "") and "--disable-custom-all-reduce" in (check.fix or "")
    # P2P off but the custom all-reduce still on: the contradiction of rtx6kpro#21.
    half = _nccl({"NCCL_P2P_DISABLE": "1"}, cmd, RTX6000)
    assert half.status is Status.WARN and "custom all-reduce" in half.summary
    fixed = _nccl({"NCCL_P2P_DISABLE": "1"}, (*cmd, "--disable-custom-all-reduce"), RTX6000)
    assert fixed.status is Status.PASS
    # The same flags on NVLink-connected H100s are fine.
    assert _nccl({}, cmd, [H100, GpuFacts(1, "NVIDIA H100", (9, 0), nvlinks=18)]).status is Status.PASS


@pytest.mark.parametrize(
    ("torch_cuda", "driver", "status"),
    [("13.0", (12, 8), Status.FAIL), ("12.8", (12, 4), Status.WARN), ("12.8", (13, 0), Status.PASS)],
)
def test_versions(torch_cuda, driver, status):
    inventory = GpuInventory(driver_version="570.1", cuda_driver_version=driver, gpus=(H100,))
    env = PyEnvFacts("python", torch_version="2.9.0", torch_cuda=torch_cuda)
    assert dc.check_versions(inventory, env, planning=False).status is status


def test_gpu_memory_held_by_others_and_cuda_processes_nvml_cannot_see():
    inventory = GpuInventory(gpus=(H100,), processes=(GpuProcessMemory(4242, 0, 40 * GiB),))
    check = dc.check_gpu_processes(inventory, HostFacts(), [H100], ours=set())
    assert check.status is Status.FAIL and "pid 4242" in check.evidence[0]
    holder = DeviceHolder(777, "python (serve.py)", ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"))
    check = dc.check_gpu_processes(
        GpuInventory(gpus=(H100,)), HostFacts(device_holders=(holder,)), [H100], set()
    )
    assert check.status is Status.WARN and "pid 777" in check.evidence[0]
    persistenced = DeviceHolder(5, "nvidia-persistenced", ("/dev/nvidia0", "/dev/nvidiactl"))
    check = dc.check_gpu_processes(
        GpuInventory(gpus=(H100,)), HostFacts(device_holders=(persistenced,)), [H100], set()
    )
    assert check.status is Status.PASS


def test_wedged_gpu():
    busy = GpuFacts(0, "NVIDIA RTX PRO 6000", (12, 0), 20 * GiB, 96 * GiB, 100.0, nvlinks=0)
    check = dc.check_gpu_wedged(GpuInventory(gpus=(busy,)), HostFacts(), [busy])
    assert check.status is Status.FAIL and "nvidia-smi -r" in (check.fix or "")
    running = GpuInventory(gpus=(busy,), processes=(GpuProcessMemory(9, 0, GiB),))
    assert dc.check_gpu_wedged(running, HostFacts(), [busy]).status is Status.PASS


def test_port_taken():
    check = dc.check_port(PortFacts(8000, False, ((123, "python (-m vllm.entrypoints...)"),)))
    assert check is not None and check.status is Status.FAIL
    assert "cleanup --port 8000" in (check.fix or "")
    assert dc.check_port(None) is None


def _module(path, package, verdicts):
    by_cap = tuple(verdicts.items())
    worst = max(verdicts.values(), key=[Coverage.NATIVE, Coverage.JIT, Coverage.NONE].index)
    return ModuleCoverage(path, (), (), worst, package, by_cap)


def test_loader_that_picks_a_directory_for_another_architecture():
    modules = [
        _module(
            "/site/sgl_kernel/sm90/common_ops.abi3.so",
            "sgl_kernel",
            {"9.0": Coverage.NATIVE, "10.0": Coverage.NONE, "12.0": Coverage.NONE},
        ),
        _module(
            "/site/sgl_kernel/sm100/common_ops.abi3.so",
            "sgl_kernel",
            {"9.0": Coverage.NONE, "10.0": Coverage.NATIVE, "12.0": Coverage.NONE},
        ),
    ]
    on_120 = cov.check_arch_directories(modules, [(12, 0)])
    assert on_120 is not None and on_120.status is Status.FAIL
    assert any("picks sm100/" in e and "built for 10.0" in e for e in on_120.evidence)
    for cap in ((9, 0), (10, 0)):
        check = cov.check_arch_directories(modules, [cap])
        assert check is not None and check.status is Status.PASS


def test_torch_arch_list():
    env = PyEnvFacts(
        "python", torch_version="2.7.0+cu126", torch_cuda="12.6", torch_arch_list=("sm_50", "sm_80", "sm_90")
    )
    assert cov.check_torch_arch(env, [(9, 0)]).status is Status.PASS
    check = cov.check_torch_arch(env, [(12, 0)])
    assert check.status is Status.FAIL and "no kernel image" in check.summary
    cpu = PyEnvFacts("python", torch_version="2.13.0+cpu", torch_cuda=None)
    assert cov.check_torch_arch(cpu, [(12, 0)]).status is Status.PASS


class FakeNvml:
    """The pynvml functions read_inventory calls, over one RTX PRO 6000 pair on PCIe."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"580.82.07"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (12, 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=GiB, total=96 * GiB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=0, memory=0)

    def nvmlDeviceGetName(self, h):
        return "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=99, usedGpuMemory=MiB)] if h else []

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 30

    def nvmlDeviceGetNvLinkState(self, h, link):
        raise self.NVMLError("Not Supported")


def test_read_inventory_with_fake_nvml():
    inv = read_inventory(FakeNvml())
    assert inv.unavailable is None
    assert inv.driver_version == "580.82.07" and inv.cuda_driver_version == (13, 0)
    assert [g.capability for g in inv.gpus] == [(12, 0), (12, 0)]
    assert all(g.nvlinks == 0 for g in inv.gpus)
    assert inv.links == ((0, 1, "PHB"),)
    assert inv.processes == (GpuProcessMemory(99, 1, MiB),)


def test_quick_env_reads_version_files(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.9.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    (site / "vllm-0.33.0.dist-info").mkdir()
    (tmp_path / "venv" / "bin").mkdir()
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text("")
    script = tmp_path / "venv" / "bin" / "vllm"
    script.write_text(f"#!{python}\nimport sys\n")
    script.chmod(0o755)
    env = quick_env(str(python), registry.distributions())
    assert (env.torch_version, env.torch_cuda) == ("2.9.1+cu128", "12.8")
    assert env.version_of("vllm") == "0.33.0"
    assert interpreter_of((str(script), "serve", "m")) == str(python)


def test_checkpoint_size(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 123456789}})
    )
    assert checkpoint_size(tmp_path).total_bytes == 123456789
    other = tmp_path / "plain"
    other.mkdir()
    (other / "a.safetensors").write_bytes(b"x" * 1000)
    (other / "b.safetensors").write_bytes(b"x" * 24)
    facts = checkpoint_size(other)
    assert facts.total_bytes == 1024 and "2 *.safetensors" in facts.source
    assert checkpoint_size(tmp_path / "nothing").error is not None


def test_memory_against_checkpoint():
    host = HostFacts(mem_available_bytes=8 * GiB, mem_total_bytes=16 * GiB)
    big = CheckpointFacts("/m", 20 * GiB, "index")
    assert dc.check_memory(host, big, [H100], cpu_only=False).status is Status.WARN
    assert dc.check_memory(host, big, [], cpu_only=True).status is Status.FAIL
    huge = CheckpointFacts("/m", 200 * GiB, "index")
    assert dc.check_memory(host, huge, [H100], cpu_only=False).status is Status.FAIL
