"""The kernels a process's GPU is running, as a debugger read them at one moment (collect/cudagdb.py).

A stall whose host waits on a GPU that works at nothing (``gpu-spin``) leaves one question the stacks
cannot answer: which kernel. cuda-gdb can list a live process's running kernels with their launch
geometry and detach, leaving the process running; that costs the target a pause of seconds (the
debugger's start-up and symbol loading), said in the report as ``paused_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class KernelOutcome(StrEnum):
    OK = "ok"  # the debugger listed the process's kernels (maybe none)
    NO_DEBUGGER = "no-debugger"  # cuda-gdb not found
    REFUSED = "refused"  # ptrace not permitted, no access to the debugger's device, another debugger
    TIMEOUT = "timeout"  # killed at its deadline
    FAILED = "failed"  # anything else the debugger said
    GONE = "gone"  # the process ended first
    STOPPED = "stopped"  # already stopped (state T): not attached to; a stopped process is evidence


@dataclass(frozen=True)
class KernelLaunch:
    """One running kernel: its demangled name with its parameter types, without argument values."""

    name: str  # "at::cuda::(anonymous namespace)::spin_kernel(long)"
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    device: int | None
    sms: int | None  # SMs it occupies now (the set bits of the debugger's SM mask)
    status: str = ""  # the debugger's word: "Active", ...
    source: str = ""  # where its code is, when the debugger says (a Triton kernel's "kernels.py:62")

    @property
    def short_name(self) -> str:
        """Without namespaces: ``spin_kernel(long)`` of ``at::cuda::(anonymous namespace)::spin_kernel(long)``
        (the last component outside brackets, its parameter types kept)."""
        bare = bare_name(self.name)
        depth, cut = 0, 0
        for i, ch in enumerate(bare):
            if ch in "<(":
                depth += 1
            elif ch in ">)":
                depth -= 1
            elif ch == ":" and depth == 0 and bare[i - 1 : i] == ":":
                cut = i + 1
        return bare[cut:] + self.name[len(bare) :]

    @property
    def launch(self) -> str:
        """``spin_kernel(long)<<<(1,1,1),(1,1,1)>>>``, as CUDA writes a launch."""
        g, b = (",".join(map(str, d)) for d in (self.grid, self.block))
        return f"{self.short_name}<<<({g}),({b})>>>"


@dataclass(frozen=True)
class KernelCapture:
    """One process, one debugger attach: what it listed, and what the attach cost the target."""

    pid: int
    outcome: KernelOutcome
    kernels: tuple[KernelLaunch, ...] = ()
    # How long the target was held: the debugger's attach to its detach, as timed from outside (an
    # upper bound: the debugger's own start before the attach is in it).
    paused_s: float = 0.0
    detail: str = ""  # the debugger's reason, where it gave none of the kernels
    state_after: str = ""  # the target's /proc state once the debugger had gone
    resumed: bool = False  # left stopped by the debugger and resumed (SIGCONT) by hangwatch
    host_frames: tuple[str, ...] = ()  # the host thread's innermost frames, as the debugger printed them


@dataclass(frozen=True)
class KernelSample:
    """One round over the processes of a GPU wait, at ``t`` (seconds since the watch began)."""

    t: float
    captures: tuple[KernelCapture, ...]
    debugger: str | None  # the cuda-gdb used, or None where none was found
    elapsed_s: float = 0.0

    def of(self, pid: int) -> KernelCapture | None:
        return next((c for c in self.captures if c.pid == pid), None)


def parameter_groups(text: str) -> list[tuple[int, str]]:
    """The parenthesised groups at the end of a name, as (start, inside), in order: ``f(long)(x=1)`` has
    two; the ``(anonymous namespace)`` inside a C++ name is not one (a ``::`` follows it)."""
    groups: list[tuple[int, str]] = []
    end = len(text)
    while end > 0 and text[end - 1] == ")":
        depth = 0
        for i in range(end - 1, -1, -1):
            if text[i] == ")":
                depth += 1
            elif text[i] == "(":
                depth -= 1
                if depth == 0:
                    groups.insert(0, (i, text[i + 1 : end - 1]))
                    end = i
                    break
        else:
            break  # unbalanced: no group
    return groups


def bare_name(name: str) -> str:
    """A kernel's name without its parameter list: how the debugger's two spellings of it meet."""
    groups = parameter_groups(name)
    return name[: groups[0][0]].rstrip() if groups else name
