"""The ``bench`` command: options, checked and parsed into a frozen BenchOptions; the work is in bench/."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from hangwatch.bench.options import BenchOptions
from hangwatch.bench.options import base_url_of
from hangwatch.cli.options import add_output_file
from hangwatch.cli.options import output_folder
from hangwatch.cli.values import number
from hangwatch.cli.values import seconds
from hangwatch.collect.http_probe import validate_probe_url
from hangwatch.errors import UsageError
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import Workload

DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 8
RATE_CONCURRENCY_CAP = 256  # with --rate and no --concurrency: bounded all the same
DEFAULT_ROUNDS_COMPARED = 3


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number")


def _command(text: str | None, flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"{flag}: cannot split the command: {exc}") from None
    if not argv:
        raise UsageError(f"{flag}: empty command")
    return argv


def workload_of(args: argparse.Namespace, prompt_count: int) -> Workload:
    if args.requests is not None and args.duration is not None:
        raise UsageError("give --requests or --duration, not both")
    _positive(args, "requests", "concurrency", "max_tokens", "rounds")  # durations: checked when parsed
    if args.warmup < 0:
        raise UsageError("--warmup must be 0 or more")
    rounds = args.rounds or (DEFAULT_ROUNDS_COMPARED if args.compare else 1)
    return Workload(
        endpoint=Endpoint(args.endpoint),
        model=args.model,
        requests=None if args.duration is not None else (args.requests or DEFAULT_REQUESTS),
        duration_s=args.duration,
        concurrency=args.concurrency or (RATE_CONCURRENCY_CAP if args.rate else DEFAULT_CONCURRENCY),
        rate=args.rate,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
        rounds=rounds,
        warmup=args.warmup,
        prompts=str(args.prompts) if args.prompts else "bundled",
        prompt_count=prompt_count,
        request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout,
    )


def bench_options(args: argparse.Namespace, prompt_count: int, run_dir: Path) -> BenchOptions:
    for flag, url in (("--url", args.url), ("--compare", args.compare)):
        if url:
            validate_probe_url(url, flag)
    urls = [args.url] + ([args.compare] if args.compare else [])
    if args.launch_b and not args.compare:
        raise UsageError("--launch-b needs --compare URL2 (where the launched server will listen)")
    launch = (_command(args.launch_a, "--launch-a"), _command(args.launch_b, "--launch-b"))
    return BenchOptions(
        urls=tuple(base_url_of(u) for u in urls),
        workload=workload_of(args, prompt_count),
        launch=launch[: len(urls)],
        boot_timeout_s=args.boot_timeout,
        stall_after_s=args.stall_after,
        run_dir=run_dir,
        probe_timeout_s=args.probe_timeout,
        report_json=args.report_json,
        report_html=args.report_html,
        quiet=args.quiet,
        metrics=not args.no_metrics,
    )


class BenchCommand:
    """Measure OpenAI-compatible servers under load; compare two (plain vs speculative) in interleaved rounds.

    Example: hangwatch bench --url http://127.0.0.1:8000 --compare http://127.0.0.1:8001 --rounds 4
    Per server: request and output-token throughput, TTFT / ITL / TPOT / E2E percentiles, errors by kind,
    and from /metrics the server's token counts and speculative acceptance (vLLM, SGLang). --requests and
    --duration apply per server per round. --launch-a/-b start the servers under hangwatch supervision, so
    a boot that hangs ends in a stall verdict, not a benchmark that waits forever.
    Exit codes: 0 done, 2 usage, 3/4/5 a launched server stalled/crashed/timed out while booting,
    6 a server could not be benchmarked (nothing listens, not OpenAI, no request succeeded), 130 interrupted.
    """

    name = "bench"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        s = parser.add_argument_group("servers")
        s.add_argument(
            "--url", required=True, help="the (first) server: http://HOST:PORT (a /v1 suffix is fine)"
        )
        s.add_argument(
            "--compare", metavar="URL2", help="a second server: the same workload, in interleaved rounds"
        )
        s.add_argument(
            "--model", help="model to request (default: the first each server lists at /v1/models)"
        )
        s.add_argument(
            "--no-metrics", action="store_true", help="do not read /metrics (no acceptance figures)"
        )
        w = parser.add_argument_group("workload (per server and per round)")
        w.add_argument("--endpoint", choices=[e.value for e in Endpoint], default="completions")
        w.add_argument("--requests", type=int, help=f"requests per round (default: {DEFAULT_REQUESTS})")
        w.add_argument(
            "--duration",
            type=seconds("--duration"),
            metavar="S",
            help="instead of --requests: send for S seconds",
        )
        w.add_argument(
            "--concurrency", type=int, help=f"requests in flight at most (default: {DEFAULT_CONCURRENCY})"
        )
        w.add_argument(
            "--rate",
            type=number("--rate", "requests per second", example="4"),
            metavar="R",
            help="Poisson arrivals, R requests/s (within --concurrency)",
        )
        w.add_argument("--max-tokens", type=int, default=128, help="default: %(default)s")
        w.add_argument(
            "--temperature",
            type=number("--temperature", "", zero_ok=True, example="0.7"),
            default=1.0,
            help="default: %(default)s",
        )
        w.add_argument(
            "--ignore-eos", action="store_true", help="ask for exactly --max-tokens tokens (vLLM, SGLang)"
        )
        w.add_argument(
            "--prompts", type=Path, metavar="FILE", help='JSONL of {"prompt": ...} lines (default: bundled)'
        )
        w.add_argument(
            "--seed", type=int, default=0, help="prompt order and arrival times (default: %(default)s)"
        )
        w.add_argument("--rounds", type=int, help="interleaved rounds (default: 3 with --compare, else 1)")
        w.add_argument(
            "--warmup", type=int, default=2, help="uncounted requests per server first (default: 2)"
        )
        t = parser.add_argument_group("timeouts")
        t.add_argument(
            "--request-timeout",
            type=seconds("--request-timeout"),
            default=600.0,
            metavar="S",
            help="per request (default: 600)",
        )
        t.add_argument(
            "--idle-timeout",
            type=seconds("--idle-timeout"),
            default=60.0,
            metavar="S",
            help="no byte for S s fails a request",
        )
        t.add_argument(
            "--probe-timeout",
            type=seconds("--probe-timeout"),
            default=10.0,
            metavar="S",
            help="GET /v1/models first (10)",
        )
        la = parser.add_argument_group("launching the servers")
        la.add_argument(
            "--launch-a", metavar="CMD", help="start the --url server with CMD (one string), supervised"
        )
        la.add_argument("--launch-b", metavar="CMD", help="start the --compare server with CMD")
        la.add_argument(
            "--boot-timeout",
            type=seconds("--boot-timeout"),
            default=900.0,
            metavar="S",
            help="boot limit (default: 900)",
        )
        la.add_argument(
            "--stall-after",
            type=seconds("--stall-after"),
            default=60.0,
            metavar="S",
            help="boot stall window (default: 60)",
        )
        la.add_argument(
            "--run-dir",
            type=output_folder("--run-dir"),
            help="launched servers' logs (default: ~/.local/state/hangwatch/runs/)",
        )
        o = parser.add_argument_group("output")
        add_output_file(o, "--report-json", "results as JSON (schema hangwatch.bench/1)")
        add_output_file(o, "--report-html", "a self-contained HTML report with plots")
        o.add_argument("--quiet", action="store_true", help="no progress display")

    def run(self, args: argparse.Namespace) -> int:
        # Imported here: httpx, jinja2 and asyncio load only when a benchmark runs, not for every command.
        from hangwatch.bench.prompts import load_prompts
        from hangwatch.bench.session import run_bench_command
        from hangwatch.supervise.session import default_run_dir

        prompts = load_prompts(args.prompts)
        options = bench_options(args, len(prompts), args.run_dir or default_run_dir())
        return run_bench_command(options, prompts)
