"""Tokens/s of the tiny Qwen3-VL through the hf backend, and prefill time with 64 overview frames.

    .venv/bin/python benchmarks/bench_generate.py [--tokens 128] [--size tiny] [--threads 2] [--spin]

Generation is forced to full length (end tokens ignored). Wall time depends on what else runs on
the machine; CPU time of this process is reported beside it (tokens per CPU-second ~ tokens/s on
an otherwise idle core). The last rows measure continuous batching: the latency of a 16-token
request sent while a long generation runs, for two lengths of the long one (it should not grow
with that length).

OpenMP's default is to spin-wait between parallel regions; on a shared machine those spinning
threads steal the cores the work needs (measured: decode ~5x slower with 2 spinning threads).
This script sets OMP_WAIT_POLICY=PASSIVE before torch loads unless --spin is given.
"""

from __future__ import annotations

import os
import sys

if "--spin" not in sys.argv:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from paravt import protocol as P  # noqa: E402
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart  # noqa: E402
from paravt.backends.hf import HFBackend  # noqa: E402
from paravt.models.tiny import build_tiny  # noqa: E402


def request(n_frames: int, side: int, max_new: int, seed: int = 0) -> GenerateRequest:
    """A main-agent request: system prompt, n timestamped side x side frames, question, think prefix."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_frames):
        parts += [TextPart(P.timestamp_text(i * 5.0)), ImagePart(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))]
    parts.append(TextPart(P.user_prompt_text("What happens?", n_frames * 5.0, "oe")))
    return GenerateRequest([Message("system", P.system_prompt("parallel")), Message("user", parts)],
                           max_new_tokens=max_new, temperature=1.0, seed=seed, prefix=P.THINK_PREFIX)


def timed(backend: HFBackend, reqs: list[GenerateRequest]):
    t, c = time.perf_counter(), time.process_time()
    out = backend.generate_sync(reqs)
    return out, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--spin", action="store_true", help="keep OpenMP's spin-waiting (no OMP_WAIT_POLICY)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, processor = build_tiny(size=args.size)
    n_params = sum(p.numel() for p in model.parameters())
    backend = HFBackend(model, processor)
    backend.renderer.stop_ids = set()
    backend.generate_sync([request(1, 64, 4)])  # warm-up
    load = os.getloadavg()[0]
    table = Table(title=f"tiny Qwen3-VL ({n_params / 1e6:.2f} M params), torch threads {torch.get_num_threads()}, "
                        f"decode threads {backend.decode_threads or torch.get_num_threads()}, "
                        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}, "
                        f"{os.cpu_count()} CPUs, load avg {load:.1f}")
    for col in ("case", "prompt tokens", "wall s", "CPU s", "new tok/s", "new tok/CPU-s"):
        table.add_column(col)
    for batch in (1, 8):
        reqs = [request(4, 64, args.tokens, seed=s) for s in range(batch)]
        out, wall, cpu = timed(backend, reqs)
        n = sum(o.completion_tokens for o in out)
        table.add_row(f"decode {args.tokens} tokens, batch {batch}, 4 frames", str(out[0].prompt_tokens),
                      f"{wall:.2f}", f"{cpu:.2f}", f"{n / wall:.0f}", f"{n / cpu:.0f}")
    for side in (64, 224):
        out, wall, cpu = timed(backend, [request(64, side, 1)])
        table.add_row(f"prefill, 64 frames {side}x{side}", f"{out[0].prompt_tokens} ({out[0].visual_tokens} visual)",
                      f"{wall:.2f}", f"{cpu:.2f}", "-", "-")
    for long_tokens in (500, 2000):
        wall = short_behind_long(backend, long_tokens)
        table.add_row(f"16-token request sent 0.2 s into a {long_tokens}-token one", "-", f"{wall:.2f}", "-", "-", "-")
    Console(width=170).print(table)


def short_behind_long(backend: HFBackend, long_tokens: int) -> float:
    """Seconds until a short request completes while a long one is decoding."""
    import asyncio

    async def run() -> float:
        long_task = asyncio.ensure_future(backend.generate([request(4, 64, long_tokens, seed=1)]))
        await asyncio.sleep(0.2)
        t = time.perf_counter()
        await backend.generate([request(4, 64, 16, seed=2)])
        wall = time.perf_counter() - t
        await long_task
        return wall

    return asyncio.run(run())


if __name__ == "__main__":
    main()
