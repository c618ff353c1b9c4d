"""What of an engine's command line makes one boot comparable with another, as data: its parallel sizes
(TP, PP, DP, EP), the switches that change what a boot does, and the package whose version is the engine's.

The phase history keys every boot by these (analyse/history.py); each profile has its own (``Profile.boot``).
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
