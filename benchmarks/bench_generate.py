"""Tokens/s of the tiny Qwen3-VL through the hf backend on this machine, and prefill time with
64 overview frames. Generation is forced to full length (end token ignored).

    .venv/bin/python benchmarks/bench_generate.py [--tokens 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from paravt import protocol as P
from paravt.backends.base import GenerateRequest, ImagePart, Message, TextPart
from paravt.backends.hf import HFBackend
from paravt.models.tiny import build_tiny


def request(n_frames: int, side: int, max_new: int, seed: int = 0) -> GenerateRequest:
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_frames):
        parts += [TextPart(P.timestamp_text(i * 5.0)), ImagePart(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))]
    parts.append(TextPart(P.user_prompt_text("What happens?", n_frames * 5.0, "oe")))
    return GenerateRequest([Message("system", P.system_prompt("parallel")), Message("user", parts)],
                           max_new_tokens=max_new, temperature=1.0, seed=seed, prefix=P.THINK_PREFIX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--size", default="tiny")
    args = ap.parse_args()
    model, processor = build_tiny(size=args.size)
    backend = HFBackend(model, processor)
    backend.renderer.stop_ids = set()
    n_params = sum(p.numel() for p in model.parameters())
    backend.generate_sync([request(1, 64, 4)])  # warm-up
    table = Table(title=f"tiny Qwen3-VL ({n_params / 1e6:.2f} M params), CPU threads {torch.get_num_threads()}")
    for col in ("case", "prompt tokens", "time s", "new tokens/s"):
        table.add_column(col)
    for batch in (1, 8):
        reqs = [request(4, 64, args.tokens, seed=s) for s in range(batch)]
        t = time.perf_counter()
        out = backend.generate_sync(reqs)
        dt = time.perf_counter() - t
        table.add_row(f"decode, batch {batch}, 4 frames", str(out[0].prompt_tokens), f"{dt:.2f}",
                      f"{sum(o.completion_tokens for o in out) / dt:.0f}")
    for side in (64, 224):
        t = time.perf_counter()
        out = backend.generate_sync([request(64, side, 1)])
        dt = time.perf_counter() - t
        table.add_row(f"prefill, 64 frames {side}x{side}", str(out[0].prompt_tokens), f"{dt:.2f}", "-")
    Console().print(table)


if __name__ == "__main__":
    main()
