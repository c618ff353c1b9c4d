"""The ``doctor`` command."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from hangwatch.analyse.doctor.archcompat import parse_capability
from hangwatch.cli.options import add_command
from hangwatch.cli.options import add_output_file
from hangwatch.cli.options import command_of
from hangwatch.doctor.session import DoctorOptions
from hangwatch.doctor.session import doctor
from hangwatch.errors import UsageError


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus {text!r}: expected GPU indices like 0,1") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--gpus {text!r}: expected GPU indices like 0,1")
    return values


def _check_python(text: str) -> None:
    """``--python`` names an interpreter that can be run: one that cannot is the user's typo, not a
    finding about the environment (exit 2, not a warning among the checks)."""
    path = Path(text).expanduser()
    if shutil.which(str(path)) is not None:
        return
    if not path.exists():
        what = "no such file" if ("/" in text or path.is_absolute()) else "not found on PATH"
    elif path.is_dir():
        what = "is a folder"
    else:
        what = "is not executable"
    raise UsageError(
        f"--python {text}: {what}: give the interpreter of the server's environment, "
        "e.g. --python ~/venvs/vllm/bin/python"
    )


class DoctorCommand:
    """Check, before launch, what makes an inference server hang at startup.

    GPU code against the GPU (SASS / PTX / nothing for its architecture, in torch and in every CUDA
    extension module of the environment), driver and CUDA versions, /dev/shm, limits, memory
    against the checkpoint, free disk for compile caches, GPUs already in use or wedged, the port,
    and NCCL settings known to hang. Exit code 0 all passed, 1 warnings, 3 failures.

    Example: hangwatch doctor --python ~/venvs/vllm/bin/python --port 8000 --model /models/llama
             hangwatch doctor --capability 12.0 -- vllm serve /models/llama -tp 2
    """

    name = "doctor"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--python",
            metavar="PATH",
            help="the interpreter of the server's environment "
            "(default: the command's, else python3 on PATH); inspected in a subprocess",
        )
        parser.add_argument("--port", type=int, metavar="N", help="the port the server will listen on")
        parser.add_argument(
            "--model", type=Path, metavar="DIR", help="the checkpoint folder (its size against free memory)"
        )
        parser.add_argument(
            "--gpus",
            type=_gpu_list,
            metavar="LIST",
            help="GPU indices the server will use (default: CUDA_VISIBLE_DEVICES, else all)",
        )
        parser.add_argument(
            "--capability",
            metavar="X.Y",
            help="check for GPUs of this compute capability instead of "
            "the ones NVML sees (planning; machines without a GPU)",
        )
        parser.add_argument(
            "--scan",
            type=Path,
            action="append",
            default=[],
            metavar="PATH",
            help="also check this shared object, or every *.so under this folder (repeatable)",
        )
        parser.add_argument(
            "--fast", action="store_true", help="only the fast checks `hangwatch run` makes before launch"
        )
        parser.add_argument("--no-cross-check", action="store_true", help="do not cross-check with cuobjdump")
        add_output_file(parser, "--report-json", "write the report as JSON (schema hangwatch.doctor/1)")
        add_command(parser, "the server command, to check its flags (tensor parallelism, port, model) too")

    def run(self, args: argparse.Namespace) -> int:

        command = command_of(args)
        capability = None
        if args.capability:
            try:
                capability = parse_capability(args.capability)
            except ValueError as exc:
                raise UsageError(f"--capability: {exc}") from None
        if args.python is not None:
            _check_python(args.python)
        if args.port is not None and not 0 < args.port < 65536:
            raise UsageError(f"--port {args.port}: not a TCP port")
        if args.model is not None and not args.model.is_dir():
            raise UsageError(f"--model {args.model}: no such folder")
        for path in args.scan:
            if not path.exists():
                raise UsageError(f"--scan {path}: no such file or folder")
        options = DoctorOptions(
            python=args.python,
            port=args.port,
            model=args.model,
            gpus=args.gpus,
            capability=capability,
            command=command,
            scan=tuple(args.scan),
            cross_check=not args.no_cross_check,
        )
        return doctor(options, fast=args.fast, report_json=args.report_json)
