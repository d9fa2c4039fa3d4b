"""Eval throughput (samples/min) against the number of concurrent workers, through `paravt serve`.

Starts one or more `paravt serve` processes on loopback (default model: a freshly built,
untrained tiny Qwen3-VL), then runs the eval runner over a SynthVT split with 1, 2, 4, 8
episodes in flight, spread over all servers (one OpenAIBackend with several endpoints, as
`paravt eval --endpoints` does). Each worker count gets a fresh run directory, so every row is
really generated. Throughput includes everything a user waits for: decoding, requests,
sub-agents, scoring, the fsync of every row.

    .venv/bin/python benchmarks/bench_eval.py [--data outputs/synth_test] [--n 24] [--workers 1,2,4,8]
        [--servers 1] [--mode parallel] [--frames 16] [--max-new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from paravt.backends.openai import OpenAIBackend
from paravt.eval.benchmarks import load_benchmark
from paravt.eval.runner import eval_config, run_eval_async
from paravt.procs import free_port


def start_servers(model: str, n: int, max_batch: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "paravt", "serve", "--model", model, "--port", str(port),
                                       "--max-batch", str(max_batch)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.time() + 300
    for p, u in zip(procs, urls):
        while True:
            if p.poll() is not None:
                raise SystemExit(f"paravt serve exited: {p.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(u + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"paravt serve at {u} did not come up in 300 s")
            time.sleep(0.2)
    return procs, urls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="SynthVT split directory (default: write a small test split)")
    ap.add_argument("--model", help="checkpoint to serve (default: an untrained tiny model)")
    ap.add_argument("--n", type=int, default=24, help="samples per worker count")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--servers", type=int, default=1, help="paravt serve processes (endpoints)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--mode", default="parallel")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    data = args.data
    if data is None:
        from paravt.synth.dataset import SynthConfig, build_split

        data = tmp / "synth"
        console.print(f"writing a {args.n}-question SynthVT test split to {data}")
        build_split(data, SynthConfig(n=args.n, seed=0, split="test", min_len=60, max_len=180))
    model = args.model
    if model is None:
        from paravt.models.tiny import build_tiny, save_pretrained

        model = str(save_pretrained(*build_tiny(), tmp / "tiny"))
    samples = load_benchmark("synthvt", data).samples[: args.n]
    cfg = eval_config(mode=args.mode, frames=args.frames, max_new_tokens=args.max_new_tokens)
    procs, urls = start_servers(model, args.servers, args.max_batch)
    rows = []
    try:
        for w in [int(x) for x in args.workers.split(",")]:
            backend = OpenAIBackend(urls[0], endpoints=urls, concurrency=max(w, 1) * 6)

            async def go(w=w, backend=backend):
                try:
                    return await run_eval_async(samples, backend, cfg, tmp / f"run_w{w}", concurrency=w,
                                                model=model)
                finally:
                    await backend.aclose()

            t = time.perf_counter()
            s = asyncio.run(go())
            dt = time.perf_counter() - t
            rows.append({"workers": w, "servers": args.servers, "samples": s["n"], "errors": s["errors"],
                         "wall_s": dt, "samples_per_min": 60 * s["n"] / dt, "latency_p50_s": s["latency_p50_s"],
                         "mean_tool_calls": s["mean_tool_calls"]})
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    table = Table(title=f"paravt eval through {args.servers} paravt serve process(es): {len(samples)} SynthVT "
                        f"samples, mode {args.mode}, K={args.frames}, {args.max_new_tokens} new tokens per turn")
    for c in ("workers", "wall s", "samples/min", "speed-up", "p50 latency s", "calls/sample", "errors"):
        table.add_column(c, justify="right")
    base = rows[0]["samples_per_min"] if rows else 1.0
    for r in rows:
        table.add_row(str(r["workers"]), f"{r['wall_s']:.1f}", f"{r['samples_per_min']:.1f}",
                      f"{r['samples_per_min'] / base:.2f}x", f"{r['latency_p50_s']:.2f}", f"{r['mean_tool_calls']:.2f}",
                      str(r["errors"]))
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
