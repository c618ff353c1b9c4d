"""The ``run`` command."""

from __future__ import annotations

import argparse
from dataclasses import replace

from hangwatch.cli.options import add_command
from hangwatch.cli.options import add_grace
from hangwatch.cli.options import add_watch_options
from hangwatch.cli.options import command_of
from hangwatch.cli.options import default_run_dir_checked
from hangwatch.cli.options import output_folder
from hangwatch.cli.options import watch_options
from hangwatch.engines import registry
from hangwatch.errors import UsageError


class RunCommand:
    """Launch a server (or any multi-process program) and supervise its startup.

    Example: hangwatch run --until-ready -- python -m vllm.entrypoints.openai.api_server --model M
    The command runs in a session of its own; when hangwatch ends (verdict, Ctrl-C, SIGTERM,
    even SIGKILL) the whole tree goes with it.
    """

    name = "run"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_watch_options(parser)
        parser.add_argument(
            "--until-ready", action="store_true", help="stop the tree after the first verdict, ready included"
        )
        parser.add_argument(
            "--run-dir",
            type=output_folder("--run-dir"),
            help="where the log and reports go (default: ~/.local/state/hangwatch/runs/...)",
        )
        parser.add_argument(
            "--keep-running",
            action="store_true",
            help="after a stall verdict leave the tree running: report it, go on watching and report again "
            "on a change or a recovery; the tree is stopped when it ends or at Ctrl-C (default: a stall "
            "stops the tree)",
        )
        add_grace(parser, "SIGTERM grace before SIGKILL at cleanup")
        parser.add_argument(
            "--no-doctor", action="store_true", help="skip the fast preflight checks (see `hangwatch doctor`)"
        )
        parser.add_argument(
            "--no-own-request",
            action="store_true",
            help="while serving, never send hangwatch's own one-token completion to the server "
            "(sent by default to the OpenAI-API servers hangwatch launched: "
            + ", ".join(p.label for p in registry.engines() if p.openai_api)
            + "; to see a wedge the gauges miss)",
        )
        parser.add_argument(
            "--no-kernel-names",
            action="store_true",
            help="at a gpu-spin verdict, do not ask cuda-gdb which kernels the GPU runs (by default it "
            "attaches to each GPU process before the tree is stopped, pausing it for seconds)",
        )
        parser.add_argument(
            "--no-flight-recorder",
            action="store_true",
            help="do not turn torch's Flight Recorder on for the tree (by default its variables are set, "
            "unless you set them, so that a stall reads each rank's last collectives)",
        )
        add_command(parser, "the command to supervise")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.run import preflight
        from hangwatch.run import run_supervised
        from hangwatch.supervise.session import RunOptions

        command = command_of(args)
        if not command:
            raise UsageError(
                "no command to run", "Put the command after `--`: hangwatch run -- CMD [ARGS...]"
            )
        if not args.no_doctor:
            preflight(command, args.engine)
        options = RunOptions(
            watch=replace(
                watch_options(args),
                own_request=not args.no_own_request,
                kernel_names=not args.no_kernel_names,
            ),
            command=command,
            until_ready=args.until_ready,
            run_dir=args.run_dir or default_run_dir_checked(),
            grace=args.grace,
            keep_running=args.keep_running,
            flight_recorder=not args.no_flight_recorder,
        )
        return run_supervised(options)
