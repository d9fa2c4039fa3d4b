"""Eval throughput (samples/min) against the number of concurrent workers, through `paravt serve`.

Starts `paravt serve` on a model (default: a freshly built untrained tiny model) on loopback,
then runs `paravt eval` on a SynthVT split with 1, 2, 4, 8 concurrent episodes.

    .venv/bin/python benchmarks/bench_eval.py --data outputs/synth_test [--n 40] [--workers 1,2,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="SynthVT split directory")
    ap.add_argument("--model", default=None)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    model = args.model
    if model is None:
        from paravt.models.tiny import build_tiny, save_pretrained

        model = str(save_pretrained(*build_tiny(), tmp / "tiny"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "paravt", "serve", "--model", model, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        samples = load_benchmark("synthvt", args.data).samples[: args.n]
        cfg = eval_config(frames=args.frames, max_new_tokens=args.max_new_tokens)
        table = Table(title=f"paravt eval through paravt serve: {len(samples)} SynthVT samples, K={args.frames}, "
                            f"{args.max_new_tokens} new tokens per turn")
        for c in ("workers", "wall s", "samples/min"):
            table.add_column(c)
        for w in [int(x) for x in args.workers.split(",")]:
            backend = OpenAIBackend(url, concurrency=w)
            t = time.perf_counter()
            asyncio.run(run_eval_async(samples, backend, cfg, tmp / f"run_{w}", concurrency=w))
            dt = time.perf_counter() - t
            table.add_row(str(w), f"{dt:.1f}", f"{60 * len(samples) / dt:.1f}")
        Console().print(table)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
