"""Parallel vs sequential episodes, and the main context in parallel vs inline mode.

The main agent is scripted to request N = 1..5 crops (in one turn for parallel/inline; one
per turn for sequential); the sub-agents are the real tiny Qwen3-VL through the hf backend,
so their batching is real. Prints wall time per episode and main-context tokens.

    .venv/bin/python benchmarks/bench_episode.py [--sub-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from paravt import protocol as P
from paravt.agent import EpisodeConfig, run_episode
from paravt.backends.hf import HFBackend
from paravt.models.tiny import build_tiny
from paravt.synth.render import make_spec, write_video


class MainScripted:
    """Main turns from a script; sub-agent requests go to the real model."""

    name = "bench"

    def __init__(self, turns: list[str], sub_backend: HFBackend):
        self.turns, self.sub, self.i = turns, sub_backend, 0

    async def generate(self, reqs):
        from paravt.backends.base import Completion

        out = []
        for r in reqs:
            if r.role == "sub":
                out += await self.sub.generate([r])
            else:
                text = self.turns[min(self.i, len(self.turns) - 1)]
                self.i += 1
                n_img = sum(len(m.images()) for m in r.messages)
                tokens = len(self.sub.renderer.render(r.messages, prefix=r.prefix).ids)
                out.append(Completion(text=text, prompt_tokens=tokens, visual_tokens=4 * n_img, completion_tokens=1))
        return out

    async def aclose(self):
        pass


def script(mode: str, windows: list[tuple[float, float]]) -> list[str]:
    think = "<think>The event is short; I look closer.</think>\n"
    answer = "<think>Done.</think><answer>A</answer>"
    if mode == "sequential":
        return [think + P.format_tool_call(a, b) for a, b in windows] + [answer]
    return [think + "\n".join(P.format_tool_call(a, b) for a, b in windows), answer]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sub-tokens", type=int, default=64, help="tokens each sub-agent generates")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--frames", type=int, default=16)
    args = ap.parse_args()
    model, processor = build_tiny(seed=0)
    video = write_video(make_spec(5, min_len=300, max_len=300), Path(tempfile.mkdtemp()) / "bench.mp4")
    table = Table(title=f"episode wall time (s) and main-context tokens; tiny Qwen3-VL on CPU, K={args.frames}, "
                        f"{args.sub_tokens} tokens per sub-agent")
    for col in ("N crops", "parallel s", "sequential s", "parallel main tokens", "inline main tokens",
                "parallel main images", "inline main images", "sub batches (parallel)"):
        table.add_column(col)
    base = {}
    for n in range(1, 6):
        windows = [(20.0 + 50 * i, 30.0 + 50 * i) for i in range(n)]
        row = {}
        for mode in ("parallel", "sequential", "inline"):
            times, ep, hf = [], None, None
            for _ in range(args.repeats):
                hf = HFBackend(model, processor, batch_wait_ms=5)
                backend = MainScripted(script(mode, windows), hf)
                cfg = EpisodeConfig(mode=mode, frames=args.frames, max_turns=n + 2 if mode == "sequential" else 3,
                                    sub_max_new_tokens=args.sub_tokens)
                # make every sub-agent generate exactly sub_tokens: no early stop on the end token
                hf.renderer.stop_ids = set()
                ep = asyncio.run(run_episode(backend, video, "Which colour?", cfg))
                times.append(ep.wall_time)
            row[mode] = (statistics.median(times), ep, hf)
        par, seq, inl = row["parallel"], row["sequential"], row["inline"]
        base.setdefault("par", par[0])
        last_main = lambda ep: ep.turns[-1].generation  # noqa: E731
        table.add_row(str(n), f"{par[0]:.2f}", f"{seq[0]:.2f}", str(last_main(par[1]).prompt_tokens),
                      str(last_main(inl[1]).prompt_tokens), str(last_main(par[1]).n_images),
                      str(last_main(inl[1]).n_images), str(par[2].batch_sizes))
    Console().print(table)


if __name__ == "__main__":
    main()
