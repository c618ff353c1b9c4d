"""The ``watch`` (sidecar), ``probe`` and ``dump`` commands."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

from hangwatch.cli.options import add_command
from hangwatch.cli.options import add_grace
from hangwatch.cli.options import add_supervision_options
from hangwatch.cli.options import command_of
from hangwatch.cli.options import output_folder
from hangwatch.cli.options import watch_options
from hangwatch.cli.values import seconds
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError
from hangwatch.model.health import ProbeKind

DEFAULT_LISTEN = "127.0.0.1:9310"
KINDS = {"startup": ProbeKind.STARTUP, "liveness": ProbeKind.LIVENESS, "readiness": ProbeKind.READINESS}


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6, ``:PORT`` for every address), the port 0-65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(
            f"--listen {text!r}: give HOST:PORT",
            "For example --listen 127.0.0.1:9310, or 0.0.0.0:9310 for a pod.",
        )
    # ":PORT" is every address, said by the user: a pod's kubelet probes the pod's IP, not loopback.
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104


class WatchCommand:
    """Keep a rolling verdict of a server's tree and serve it: a sidecar for probes and Prometheus.

    The same read-only watch as attach (nothing is ever signalled), or, with -- CMD, a tree it launches
    and stops only when it is itself stopped; it never ends at a verdict: a stall is a
    reading that stands until the tree progresses again. Endpoints, answered from the latest reading in
    microseconds: /startup (fails only on a stall, a crash or an end), /live (fails only on a stall
    while serving or a dead member), /ready (serving, nothing wedged, the engine's own probe green),
    /verdict (JSON), /metrics (Prometheus). Startup and liveness fail open: hangwatch's own trouble
    never fails them. At each stall its evidence (the report, with stacks) is written to
    --evidence-dir before anyone restarts the server. docs/sidecar.md has manifests and alert rules.
    """

    name = "watch"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        t = parser.add_argument_group("what to watch")
        t.add_argument("--pid", type=int, help="PID of the server's main (launcher) process")
        t.add_argument(
            "--match",
            metavar="REGEX",
            help="the topmost process whose command line or title matches; waited for if none runs yet",
        )
        t.add_argument(
            "--cgroup",
            metavar="REGEX",
            help="a container's processes: the topmost one whose cgroup path matches (its container ID, "
            "say); with --match, both must",
        )
        t.add_argument("--whole-machine", action="store_true", help="allow --pid 1 (a container's init)")
        t.add_argument("--log", type=Path, metavar="FILE", help="the server's log file to follow")
        g = parser.add_argument_group("what to watch for")
        g.add_argument("--engine", choices=sorted(PROFILES), help="engine profile (default: detected)")
        add_supervision_options(g, timeout_help="not for a sidecar: it watches until stopped")
        s = parser.add_argument_group("serving")
        s.add_argument(
            "--listen",
            type=listen_address,
            default=listen_address(DEFAULT_LISTEN),
            metavar="HOST:PORT",
            help=f"where to serve the endpoints (default: {DEFAULT_LISTEN}; 0.0.0.0:PORT for a pod's probes)",
        )
        s.add_argument(
            "--evidence-dir",
            type=output_folder("--evidence-dir"),
            metavar="DIR",
            help="where each stall's report is written (default: a new run folder under "
            "~/.local/state/hangwatch/runs)",
        )
        s.add_argument("--no-stacks", action="store_true", help="never take stacks (py-spy)")
        s.add_argument(
            "--quiet", action="store_true", help="no live view, no echo of a launched command's output"
        )
        add_grace(s, "launched: when stopped, how long to wait after SIGTERM before SIGKILL (default: 10)")
        add_command(
            parser,
            "launch this and watch it (a container's entrypoint): never stopped at a stall, stopped when the "
            "sidecar is; the sidecar ends with its status",
        )

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.cli.options import default_run_dir_checked
        from hangwatch.sidecar.session import SidecarOptions
        from hangwatch.sidecar.session import run_sidecar

        command = command_of(args)
        if sum((args.pid is not None, args.match is not None, bool(command))) != 1:
            raise UsageError(
                "give one of --pid PID, --match REGEX or -- CMD: the server to watch (or launch)"
            )
        if args.timeout is not None:
            raise UsageError("--timeout: a sidecar watches until it is stopped; drop it")
        if args.stall_after == "auto":
            raise UsageError("--stall-after auto: only for run and isolate; give a number of seconds")
        if args.log is not None and args.pid is not None and not args.log.is_file():
            # With --match the server may not have started yet, nor written its log: looked for then.
            raise UsageError(f"--log {args.log}: no such file")
        pattern = _pattern("--match", args.match)
        cgroup = _pattern("--cgroup", args.cgroup)
        args.report_json = None
        host, port = args.listen
        return run_sidecar(
            SidecarOptions(
                watch=watch_options(args),
                pid=args.pid,
                match=pattern,
                host=host,
                port=port,
                log=args.log,
                evidence_dir=args.evidence_dir or default_run_dir_checked(),
                whole_machine=args.whole_machine,
                command=command,
                grace=args.grace,
                cgroup=cgroup,
            )
        )


def _pattern(flag: str, text: str | None) -> re.Pattern[str] | None:
    try:
        return re.compile(text) if text is not None else None
    except re.error as exc:
        raise UsageError(f"{flag} {text!r} is not a regular expression: {exc}") from None


def _add_client_options(parser: argparse.ArgumentParser, timeout_s: float, why: str) -> None:
    """--url and --timeout of a client of the sidecar (probe, dump)."""
    parser.add_argument(
        "--url",
        default=f"http://{DEFAULT_LISTEN}",
        help=f"the sidecar's address (default: http://{DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--timeout",
        type=seconds("--timeout"),
        default=timeout_s,
        metavar="S",
        help=f"give up after S seconds (default: {timeout_s:g}; {why})",
    )


def _sidecar_url(args: argparse.Namespace) -> str:
    parts = urlsplit(str(args.url))
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise UsageError(
            f"--url {args.url!r}: give the sidecar's http://HOST:PORT",
            f"For example http://{DEFAULT_LISTEN}.",
        )
    return str(args.url)


class ProbeCommand:
    """Ask a running `hangwatch watch` sidecar one probe: exit 0 passes, 1 fails (an exec probe).

    One line of output (under 1 KiB: the kubelet keeps it in the pod's events), within --timeout. When
    the sidecar cannot be reached, startup and liveness pass open (hangwatch's own trouble must not
    restart a healthy server) and readiness fails.
    """

    name = "probe"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--kind", choices=sorted(KINDS), required=True, help="which probe to answer")
        _add_client_options(parser, 2.0, "set it below the probe's timeoutSeconds")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.sidecar.client import ask

        reply = ask(_sidecar_url(args), KINDS[args.kind], args.timeout)
        print(reply.line, flush=True)
        return reply.exit_code


class DumpCommand:
    """Ask a running `hangwatch watch` sidecar to write its whole report now: for a preStop hook.

    The report (the reading, the standing verdict or the state so far, stacks, GPU readings, the log's
    tail) goes to the sidecar's --evidence-dir; its path is printed. Exit 0 when written, 1 otherwise.
    """

    name = "dump"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        _add_client_options(parser, 20.0, "the sidecar waits up to 15 s for its loop")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.sidecar.client import dump

        reply = dump(_sidecar_url(args), args.timeout)
        print(reply.line, flush=True)
        return reply.exit_code
