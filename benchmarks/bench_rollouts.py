"""GRPO rollouts of the tiny model, the same jobs on three engines: in-process (hf backend), one
`paravt serve` and one vLLM server (both started here); and the disk weight sync of each server.

    .venv/bin/python benchmarks/bench_rollouts.py --data data/mini_test [--vllm-python .venv-vllm/bin/python]

A job is one GRPO rollout (prompt x rollout index, temperature 0.7, seeded), run through
`train.grpo.rollouts.run_rollouts` as the trainer runs them: all launched together, so each engine
batches them its own way. Tokens/s counts every generated token (main turns and sub-agents).
The sync figure is `RolloutServers.sync` after `write_sync_weights`: write the consolidated
safetensors, then pause, reload_weights, set the version, resume.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def jobs_for(data: Path, prompts: int, rollouts: int, k: int):
    from paravt.data import load_rl_rows
    from paravt.train.grpo import Job, rollout_seed

    samples = load_rl_rows(data / "rl.parquet")[:prompts]
    return [Job(g, r, s, k, 0, rollout_seed(0, 0, s.id, r)) for g, s in enumerate(samples) for r in range(rollouts)]


def timed_rollouts(backend, jobs, cfg) -> tuple[float, int, int]:
    from paravt.train.grpo import run_rollouts

    t = time.perf_counter()
    eps = asyncio.run(run_rollouts(backend, jobs, cfg, 0.7))
    wall = time.perf_counter() - t
    ok = [e for e in eps if not isinstance(e, BaseException)]
    tokens = sum(t.generation.completion_tokens for e in ok for t in e.turns)
    tokens += sum(c.generation.completion_tokens for e in ok for c in e.subcalls() if c.generation)
    return wall, tokens, len(jobs) - len(ok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("data/mini_test"))
    ap.add_argument("--model", default=None, help="checkpoint (default: the shipped tiny model)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--k", type=int, default=4, help="overview frames (4: the model crops)")
    ap.add_argument("--vllm-python", default=None)
    args = ap.parse_args()
    from paravt.agent import EpisodeConfig
    from paravt.ask import DEFAULT_MODEL
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model
    from paravt.train.engine import init_engine
    from paravt.train.rollout import RolloutConfig, RolloutServers, write_sync_weights

    model_dir = args.model or str(DEFAULT_MODEL)
    cfg = EpisodeConfig(mode="parallel", max_turns=3, max_new_tokens=256, sub_max_new_tokens=64)
    jobs = jobs_for(args.data, args.prompts, args.rollouts, args.k)
    model, processor = load_model(model_dir, device="cpu")
    rows = []
    timed_rollouts(HFBackend(model, processor), jobs[:2], cfg)  # warm-up
    wall, tok, failed = timed_rollouts(HFBackend(model, processor), jobs, cfg)
    rows.append(("in-process (hf backend)", wall, tok, failed, None))
    engine = init_engine("single", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        kinds = [("paravt serve", "paravt", None, [])]
        if args.vllm_python:
            kinds.append(("vLLM", "vllm", args.vllm_python,
                          ["--dtype", "float32", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15"]))
        for label, launch, python, extra in kinds:
            rc = RolloutConfig(engine="servers", launch=launch, devices=["cpu"], vllm_python=python or "",
                               server_args=extra, concurrency=64)
            servers = RolloutServers.start(rc, model_dir, Path(tmp) / launch)
            try:
                timed_rollouts(servers.backend(), jobs[:2], cfg)  # warm-up (vLLM compiles on first use)
                wall, tok, failed = timed_rollouts(servers.backend(), jobs, cfg)
                syncs = []
                for v in range(3):
                    t = time.perf_counter()
                    weights = write_sync_weights(engine, model, processor, Path(tmp) / launch, str(v))
                    servers.sync(weights, str(v))
                    syncs.append(time.perf_counter() - t)
                rows.append((label, wall, tok, failed, sorted(syncs)[1]))
            finally:
                servers.close()
    n_threads = os.environ.get("OMP_NUM_THREADS", "default")
    t = Table(title=f"{len(jobs)} GRPO rollouts ({args.prompts} prompts x {args.rollouts}), K={args.k}, tiny model, "
                    f"CPU ({os.cpu_count()} cores, OMP_NUM_THREADS={n_threads}, load avg {os.getloadavg()[0]:.1f})")
    for c in ("engine", "wall s", "generated tokens", "tokens/s", "failed", "weight sync s (median of 3)"):
        t.add_column(c)
    for label, wall, tok, failed, sync in rows:
        t.add_row(label, f"{wall:.2f}", str(tok), f"{tok / wall:.0f}", str(failed), "-" if sync is None else f"{sync:.2f}")
    Console(width=160).print(t)


if __name__ == "__main__":
    sys.exit(main())
