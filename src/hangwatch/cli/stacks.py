"""The ``stacks`` command."""

from __future__ import annotations

import argparse

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
from hangwatch.cli.options import add_output_file
from hangwatch.cli.values import seconds
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError
from hangwatch.nodes.ray import WORKER_CLASSES

# What the stack rules need by default: a wait is told from work only over two captures or more
# (StackContext.over_time: one capture names no cause but a stopped or dead rank), and three, as a
# watch takes them (analyse/stackwatch.SAMPLES), keep a loop that passes one line twice from passing
# for a wait; 1 s apart, the snapshot takes about 2 s.
SAMPLES = 3
EVERY_S = 1.0


class StacksCommand:
    """Take the stacks of every process of a running tree now, merged across ranks, with a cause.

    With --hosts (or --hostfile) and --match: the same on every node through ssh, merged into one report
    whose ranks say their node, with who is missing from the world and each node's clock skew and errors.
    With --kube-selector: the same in every pod the selector names, through kubectl exec. With
    --slurm-job: on every node of a running job, through srun --overlap.

    Read-only: processes in state T are not dumped (they are reported as stopped), and a process a
    dump leaves stopped is resumed. Needs the same permission as a debugger (py-spy uses ptrace).
    """

    name = "stacks"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pid", type=int, help="PID of the tree's root (the launcher), on this machine")
        parser.add_argument(
            "--whole-machine",
            action="store_true",
            help="allow --pid 1 (or a container's init): dump every Python process of the machine",
        )
        parser.add_argument("--engine", choices=sorted(PROFILES), help="engine profile (default: detected)")
        parser.add_argument(
            "--samples",
            type=int,
            default=SAMPLES,
            metavar="N",
            help="capture rounds, to see what moves (default: %(default)s)",
        )
        parser.add_argument(
            "--every",
            type=seconds("--every"),
            default=EVERY_S,
            metavar="S",
            help="seconds between rounds (default: %(default)g)",
        )
        parser.add_argument(
            "--no-native", action="store_true", help="Python frames only (no --native unwinding)"
        )
        parser.add_argument(
            "--kernel-names",
            action="store_true",
            help="when the cause is gpu-spin, ask cuda-gdb which kernels the GPUs run: it attaches to each "
            "process of the tree and pauses its host for seconds (its GPU runs on); off by default",
        )
        add_output_file(parser, "--report-json", "write the samples and the merged tree")
        add_node_options(parser)
        add_kube_options(parser)
        add_slurm_options(parser, fanout=True)
        add_ray_options(parser)

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.stacks import SnapshotOptions
        from hangwatch.stacks import take_snapshot

        if args.samples < 1 or args.samples > 100:
            raise UsageError("--samples must be between 1 and 100")
        if args.hosts or args.hostfile or args.kube_selector or args.slurm_job or args.ray:
            return self._across_nodes(args)
        if args.pid is None:
            raise UsageError("give --pid (this machine) or --hosts/--hostfile with --match (several nodes)")
        options = SnapshotOptions(
            pid=args.pid,
            engine=args.engine,
            samples=args.samples,
            every_s=args.every,
            native=not args.no_native,
            report_json=args.report_json,
            whole_machine=args.whole_machine,
            kernel_names=args.kernel_names,
        )
        return take_snapshot(options)

    def _across_nodes(self, args: argparse.Namespace) -> int:
        from hangwatch.nodes.session import NodesStacksOptions
        from hangwatch.nodes.session import stacks_across_nodes

        if args.pid is not None or not (args.match or args.ray):
            raise UsageError(
                "across nodes, select the server's processes with --match REGEX (pids differ per node)"
            )
        if args.samples > 20:
            raise UsageError("--samples must be between 1 and 20 across nodes")
        check_one_transport(args)
        return stacks_across_nodes(
            NodesStacksOptions(
                hosts=tuple(hosts_of(args)),
                match=args.match or "",
                engine=args.engine,
                samples=args.samples,
                every_s=args.every,
                native=not args.no_native,
                ssh=ssh_options_of(args),
                report_json=args.report_json,
                kube=kube_options_of(args) if args.kube_selector else None,
                kube_selector=args.kube_selector,
                slurm=slurm_options_of(args) if args.slurm_job else None,
                ray=ray_options_of(args) if args.ray else None,
                ray_classes=tuple(args.ray_actor_class) or WORKER_CLASSES,
                ray_task=bool(args.ray and args.ray_task),
                ray_python=args.ray_python,
            )
        )
