"""Doctor's NCCL and engine-environment check: settings that contradict each other or are known to hang.

From docs/engine-facts.md: the PCIe P2P / custom all-reduce spin on workstation Blackwell GPUs ("Hangs
seen in the wild"), what NCCL's variables do and what the engines set.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from enum import StrEnum

from hangwatch.engines import registry
from hangwatch.engines.profile import CUSTOM_ALL_REDUCE_PCIE_OFF
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


def _between(
    version: tuple[int, ...] | None, low: tuple[int, ...], high: tuple[int, ...] | None = None
) -> bool:
    """A known version from ``low`` up to ``high`` (both included; no upper end without one)."""
    return bool(version) and version is not None and low <= version and (high is None or version <= high)


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


class Severity(StrEnum):
    FAIL = "fail"  # the run cannot work: the check fails
    WARN = "warn"  # known to hang or to look hung
    NOTE = "note"  # what an engine does with the setting, for the evidence


@dataclass(frozen=True)
class Setting:
    """What the rules read: the environment and command, the GPUs and host, and what follows from them."""

    env: Mapping[str, str]
    command: Sequence[str]
    gpus: Sequence[GpuFacts]
    inventory: GpuInventory
    host: HostFacts
    pyenv: PyEnvFacts | None

    @property
    def cmd(self) -> str:
        return " ".join(self.command)

    @property
    def p2p_off(self) -> bool:
        return self.env.get("NCCL_P2P_DISABLE") == "1"

    @property
    def tp(self) -> int | None:
        return tensor_parallel(self.command)

    @property
    def multi(self) -> bool:
        """More than one rank: the server's TP size, else the GPUs listed."""
        tp = self.tp
        return tp >= 2 if tp is not None else len(self.gpus) >= 2

    @property
    def pcie_only(self) -> list[GpuFacts]:
        return [
            g
            for g in self.gpus
            if (g.nvlinks == 0) or (g.synthetic and g.capability and g.capability[0] == 12)
        ]

    @property
    def blackwell_ws(self) -> list[GpuFacts]:
        return [g for g in self.gpus if g.capability and g.capability[0] == 12]

    @property
    def p2p_spin_risk(self) -> bool:
        """Tensor parallelism over PCIe-only workstation Blackwell GPUs: the first all-reduce may spin."""
        return self.multi and bool(self.pcie_only) and bool(self.blackwell_ws)

    @property
    def links(self) -> list[str]:
        return [
            f"GPU {a}-GPU {b}: {level}"
            for a, b, level in self.inventory.links
            if level in ("PHB", "NODE", "SYS")
        ]

    def version(self, *distributions: str) -> tuple[int, ...] | None:
        """The installed version of the first of ``distributions`` found (an engine's packages)."""
        return _version_tuple(self.pyenv.version_of(*distributions) if self.pyenv else None)

    @property
    def nccl(self) -> tuple[int, ...] | None:
        return _version_tuple(self.pyenv.nccl_version if self.pyenv else None)


@dataclass(frozen=True)
class EnvRule:
    """One known setting: when it applies, what it means, what fixes it, how bad it is."""

    name: str
    applies: Callable[[Setting], bool]
    message: Callable[[Setting], str]
    severity: Severity = Severity.WARN
    fix: str | None = None


def _p2p_spin(s: Setting) -> str:
    ranks = s.tp if s.tp is not None else len(s.blackwell_ws)  # the server's TP size, not the GPUs listed
    return (
        f"tensor parallelism over {plural(ranks, 'PCIe-only compute-capability-12 GPU')} (RTX PRO "
        "6000 / 5090 class) "
        "with NCCL P2P on: the first all-reduce is known to spin forever (NVIDIA/nccl#1999, "
        "local-inference-lab/rtx6kpro#15, vllm#22479)" + (f"; links: {', '.join(s.links)}" if s.links else "")
    )


# In the order their words are listed (failures first, then warnings, then notes; fixes in this order).
RULES: tuple[EnvRule, ...] = (
    EnvRule(
        "p2p-level-ignored",
        lambda s: s.p2p_off and bool(s.env.get("NCCL_P2P_LEVEL")),
        lambda s: (
            f"NCCL_P2P_DISABLE=1 and NCCL_P2P_LEVEL={s.env['NCCL_P2P_LEVEL']} contradict: the level is "
            "ignored"
        ),
    ),
    EnvRule(
        "p2p-and-shm-off",
        lambda s: s.p2p_off and s.env.get("NCCL_SHM_DISABLE") == "1",
        lambda s: (
            "NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1: GPUs of one host then talk through the network "
            "transport "
            "(sockets), slow enough at startup to look hung"
        ),
    ),
    EnvRule(
        "socket-ifname-matches-nothing",
        lambda s: (
            bool(s.env.get("NCCL_SOCKET_IFNAME"))
            and bool(s.host.net_interfaces)
            and not socket_ifname_matches(s.env["NCCL_SOCKET_IFNAME"], s.host.net_interfaces)
        ),
        lambda s: (
            f"NCCL_SOCKET_IFNAME={s.env['NCCL_SOCKET_IFNAME']} matches no interface "
            f"({', '.join(s.host.net_interfaces)}): NCCL init "
            "fails "
            "or waits for a peer that never connects"
        ),
        Severity.FAIL,
    ),
    EnvRule(
        "debug-trace",
        lambda s: s.env.get("NCCL_DEBUG", "").upper() == "TRACE",
        lambda s: "NCCL_DEBUG=TRACE logs every operation: startup slows down and logs grow by gigabytes",
    ),
    EnvRule(
        "launch-blocking",
        lambda s: s.env.get("CUDA_LAUNCH_BLOCKING") == "1",
        lambda s: (
            "CUDA_LAUNCH_BLOCKING=1 serialises every kernel: slow startup, and it can hide or move the hang"
        ),
    ),
    EnvRule(
        "pcie-blackwell-p2p",
        lambda s: s.p2p_spin_risk and not s.p2p_off,
        _p2p_spin,
        fix="NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_CUMEM_HOST_ENABLE=0",
    ),
    EnvRule(
        "pcie-blackwell-custom-all-reduce",
        lambda s: s.p2p_spin_risk and "--disable-custom-all-reduce" not in s.command and bool(s.command),
        lambda s: (
            "custom all-reduce is on: it uses P2P through CUDA IPC whatever NCCL_P2P_DISABLE says, and "
            "its "
            "kernel is the one seen polling a peer flag forever on these GPUs (rtx6kpro#21)"
        ),
        fix="--disable-custom-all-reduce",  # and the engines' own settings: rules()
    ),
    EnvRule(
        "nccl-p2p-hang-range",
        lambda s: (
            _between(s.nccl, (2, 26, 5), (2, 29, 2)) and s.multi and bool(s.blackwell_ws) and not s.p2p_off
        ),
        lambda s: (
            f"NCCL {s.pyenv.nccl_version if s.pyenv else ''} is in the range reported to hang "
            "all_reduce with P2P on "
            "dual RTX PRO 6000 (2.26.5-2.29.2, NVIDIA/nccl#1999)"
        ),
    ),
    EnvRule(
        "nccl-nvls-spark",
        lambda s: (
            s.nccl == (2, 30, 4)
            and any(g.capability == (12, 1) for g in s.gpus)
            and s.env.get("NCCL_NVLS_ENABLE") != "0"
        ),
        lambda s: (
            "NCCL 2.30.4 with NVLS on a compute-capability-12.1 GPU (DGX Spark) was reported to hang the "
            "MoE weight "
            "load in some boots (NVIDIA/nccl#2167)"
        ),
        fix="NCCL_NVLS_ENABLE=0",
    ),
)

# Where the engines' settings keep the custom all-reduce off PCIe, its fix names them too.
_CUSTOM_ALL_REDUCE = "pcie-blackwell-custom-all-reduce"


def rules() -> tuple[EnvRule, ...]:
    """``RULES`` with the engines' own (each profile's ``env_rules``, through the registry): each after
    the rule it names and the engine rules already placed there, or last where that rule is absent."""
    settings = [flag for _, flag in registry.flags_for(CUSTOM_ALL_REDUCE_PCIE_OFF)]
    out = [
        replace(r, fix=f"{r.fix} (and {' and '.join(settings)})")
        if r.name == _CUSTOM_ALL_REDUCE and settings
        else r
        for r in RULES
    ]
    placed: set[str] = set()
    for rule in registry.env_rules():
        names = [r.name for r in out]
        at = names.index(rule.after) + 1 if rule.after in names else len(out)
        while at < len(out) and out[at].name in placed:
            at += 1
        out.insert(at, EnvRule(rule.name, rule.applies, rule.message, Severity(rule.severity)))
        placed.add(rule.name)
    return tuple(out)


def check_nccl_env(
    env: Mapping[str, str],
    *,
    command: Sequence[str],
    gpus: Sequence[GpuFacts],
    inventory: GpuInventory,
    host: HostFacts,
    pyenv: PyEnvFacts | None,
) -> Check:
    """NCCL and engine settings that contradict each other or are known to hang: ``RULES``, in order.

    From docs/engine-facts.md (the P2P spin, NCCL's variables, the engines' environment).
    """
    name = "nccl-env"
    setting = Setting(env, command, gpus, inventory, host, pyenv)
    found: dict[Severity, list[str]] = {s: [] for s in Severity}
    fixes: list[str] = []
    for rule in rules():
        if rule.applies(setting):
            found[rule.severity].append(rule.message(setting))
            if rule.fix:
                fixes.append(rule.fix)
    fail, warn, notes = found[Severity.FAIL], found[Severity.WARN], found[Severity.NOTE]
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
