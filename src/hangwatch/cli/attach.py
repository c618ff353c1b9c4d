"""The ``attach`` command."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from hangwatch.analyse.assess import DEFAULT_STALL_AFTER_S
from hangwatch.cli.node_options import add_kube_options
from hangwatch.cli.node_options import add_node_options
from hangwatch.cli.node_options import add_ray_options
from hangwatch.cli.node_options import add_slurm_options
from hangwatch.cli.node_options import check_one_transport
from hangwatch.cli.node_options import hosts_of
from hangwatch.cli.node_options import kube_options_of
from hangwatch.cli.node_options import ray_options_of
from hangwatch.cli.node_options import slurm_options_of
from hangwatch.cli.node_options import ssh_options_of
from hangwatch.cli.options import add_watch_options
from hangwatch.cli.options import watch_options
from hangwatch.cli.values import seconds
from hangwatch.errors import UsageError


def stall_window(given: float | str | None, window: float) -> float:
    """The stall window of an attach: the one given, else run's default, cut to the watch's own window
    (a 30 s watch cannot wait out 60 s of quiet: its end would read as progress). The same rule as run's
    otherwise: attach's --window is how long to watch, not how long a quiet spell may last."""
    if isinstance(given, str):  # STALL_AUTO, the one word the option takes
        raise UsageError(
            "--stall-after auto: only for run and isolate, whose boots hangwatch watches from their start "
            "and times phase by phase",
            f"Give attach a number of seconds (default: {DEFAULT_STALL_AFTER_S:g}, or its --window when "
            "shorter).",
        )
    return given if given is not None else min(DEFAULT_STALL_AFTER_S, window)


class AttachCommand:
    """Watch a server someone else started, read-only, and give the same verdict.

    Nothing is ever signalled, stopped or killed in attach mode. The server's log is followed from
    --log, or found automatically when its stdout or stderr is a regular file.

    With --hosts (or --hostfile), --kube-selector or --slurm-job, and --match: the same watch across
    nodes, through ssh, kubectl exec or srun. Each interval a cheap census of every node feeds one
    verdict for the job; stacks are taken on every node when it goes quiet; a node that stops answering
    is evidence, and progress on any node is progress of the job.
    """

    name = "attach"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--pid", type=int, help="PID of the server's main (launcher) process, on this machine"
        )
        parser.add_argument(
            "--whole-machine",
            action="store_true",
            help="allow --pid 1 (or a container's init): watch every process of the machine",
        )
        parser.add_argument(
            "--window",
            type=seconds("--window"),
            default=60.0,
            metavar="S",
            help="watch for S seconds (default: 60); without --stall-after, a window shorter than the "
            "default stall window is the stall window too",
        )
        parser.add_argument("--log", type=Path, metavar="FILE", help="the server's log file to follow")
        parser.add_argument(
            "--own-request",
            action="store_true",
            help="while it serves, send the server a one-token completion of hangwatch's own, with a "
            "deadline (the only traffic attach ever sends besides the readiness probe; off by default)",
        )
        parser.add_argument(
            "--kernel-names",
            action="store_true",
            help="at a gpu-spin verdict, ask cuda-gdb which kernels the GPU runs: it attaches to each GPU "
            "process and pauses its host for seconds (its GPU runs on); off by default",
        )
        add_watch_options(parser, stall_default=None)
        add_node_options(parser)
        add_kube_options(parser)
        add_slurm_options(parser)
        add_ray_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.attach import AttachOptions
        from hangwatch.attach import run_attached
        from hangwatch.collect.proctree import whole_machine_note

        stall = stall_window(args.stall_after, args.window)
        if args.hosts or args.hostfile or args.kube_selector or args.slurm_job or args.ray:
            return self._across_nodes(args, stall)
        if args.pid is None:
            raise UsageError("give --pid (this machine) or --hosts/--hostfile with --match (several nodes)")
        if args.log is not None and not args.log.is_file():
            raise UsageError(f"--log {args.log}: no such file")
        options = AttachOptions(
            watch=replace(
                watch_options(args, stall_after_s=stall),
                own_request=args.own_request,
                kernel_names=args.kernel_names,
            ),
            pid=args.pid,
            window=args.window,
            log=args.log,
            whole_machine=args.whole_machine,
        )
        note = whole_machine_note(args.pid) if args.whole_machine else None  # refused without the flag
        if note is not None:
            print(f"hangwatch attach: {note}", file=sys.stderr, flush=True)
        return run_attached(options)

    def _across_nodes(self, args: argparse.Namespace, stall: float) -> int:
        from hangwatch.nodes.ray import WORKER_CLASSES
        from hangwatch.nodes.watch import NodesAttachOptions
        from hangwatch.nodes.watch import attach_across_nodes

        if args.pid is not None or not (args.match or args.ray):
            raise UsageError(
                "across nodes, select the server's processes with --match REGEX (pids differ per node)"
            )
        if args.ray and args.match:
            raise UsageError("--ray selects the ranks by their actors (--ray-actor-class): drop --match")
        if args.ray_task:
            # A watch needs a census every round from a session kept open; a Ray job per round would
            # cost a driver's start (10-20 s) each time and a worker slot on every node.
            raise UsageError("--ray-task is for stacks --ray; attach --ray reads each node over ssh")
        unsupported = [
            flag
            for flag, given in (
                ("--own-request", args.own_request),
                ("--report-html", args.report_html is not None),
                ("--report-md", args.report_md is not None),
            )
            if given
        ]
        check_one_transport(args)
        if unsupported:
            raise UsageError(f"{', '.join(unsupported)}: not supported across nodes yet")
        w = watch_options(args, stall_after_s=stall)
        return attach_across_nodes(
            NodesAttachOptions(
                hosts=tuple(hosts_of(args)),
                match=args.match or "",
                engine=args.engine,
                window_s=args.window,
                stall_after_s=w.stall_after_s,
                ready_url=w.ready_url,
                interval_s=w.interval,
                stacks=w.stacks,
                quiet=w.quiet,
                ssh=ssh_options_of(args),
                report_json=args.report_json,
                kube=kube_options_of(args) if args.kube_selector else None,
                kube_selector=args.kube_selector,
                slurm=slurm_options_of(args) if args.slurm_job else None,
                ray=ray_options_of(args) if args.ray else None,
                ray_classes=tuple(args.ray_actor_class) or WORKER_CLASSES,
                log=args.log,  # a path on the nodes, not here: not checked on this machine
                ready_pattern=w.ready_pattern,
            )
        )
