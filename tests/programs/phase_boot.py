"""A boot in phases: prints vLLM's startup lines (docs/engine-facts.md) with a pause after each, then a
ready line, then waits to be stopped. Under ``hangwatch run --engine vllm --ready-pattern READY`` its
phases are process_start, weights, model_loaded, ready; each as long as ``--pause`` seconds, a quiet
spell of that length (a sleep: no CPU, no output), unless ``--pause-in PHASE=S`` gives it another.
``--hang-in PHASE`` never leaves that phase (a sleep with no end, as quiet as its pauses).

``--port`` is taken and ignored: the engine's health probe is pointed at it (a free port) so that no
server of the machine answers for this program.

Example::

    python tests/programs/phase_boot.py --pause 1.0 --pause-in weights=8 --hang-in model_loaded
"""

from __future__ import annotations

import argparse
import time

from _util import log

PHASES = (
    ("process_start", "INFO vLLM API server version 0.0.0"),
    ("weights", "INFO Loading model from scratch"),
    ("model_loaded", "INFO Loading weights took 1.00 seconds"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause", type=float, default=1.0, help="seconds each phase lasts")
    parser.add_argument(
        "--pause-in", action="append", default=[], metavar="PHASE=S", help="another length for one phase"
    )
    parser.add_argument("--hang-in", choices=[name for name, _ in PHASES], help="never leave this phase")
    parser.add_argument("--port", type=int, help="ignored (the probe's port)")
    parser.add_argument("--enforce-eager", action="store_true", help="ignored: a switch of vLLM's boot key")
    args = parser.parse_args()
    pauses = {name: float(s) for name, _, s in (p.partition("=") for p in args.pause_in)}
    for name, line in PHASES:
        log(line)
        if name == args.hang_in:
            time.sleep(3600)  # ended by hangwatch's verdict
        time.sleep(pauses.get(name, args.pause))
    log("READY to serve")
    time.sleep(600)  # stopped by hangwatch once ready (--until-ready)


if __name__ == "__main__":
    main()
