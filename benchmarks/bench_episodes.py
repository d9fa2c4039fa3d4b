"""Episodes per minute: a batch of ParaVT episodes run together on one hf backend, every model call
real (the figure a user of `paravt ask` or a rollout phase feels), parallel vs sequential.

    python benchmarks/bench_episodes.py --arch 8b --device cuda --episodes 8 --frames 64 --crops 5
    python benchmarks/bench_episodes.py --arch tiny --device cpu --episodes 2 --frames 4   # the code path

Each episode asks for `--crops` crops of 10 s: in one turn (parallel) or one a turn (sequential),
then answers. The main agent's turns are the script's text, but each costs what a real main turn
costs: the hf backend prefills the real K-frame context and decodes as many tokens as the scripted
turn has (forced length, its tokens thrown away), so the prompts grow turn by turn as they would.
The sub-agents are real generations of `--sub-tokens` tokens. All episodes share the backend: the
rows of different episodes (main turns, sub-agents) batch together, as in a rollout phase. The
model is Qwen3-VL-8B's architecture with random weights at 8B: speed only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour, however it is started
from bench_episode import build_model, crops, open_video, script  # noqa: E402

from paravt.agent import EpisodeConfig, run_episode  # noqa: E402
from paravt.backends.base import Completion, GenerateRequest  # noqa: E402
from paravt.backends.hf import HFBackend  # noqa: E402
from paravt.backends.scripted import is_subagent  # noqa: E402
from paravt.synth.render import make_spec  # noqa: E402


class ForcedMain:
    """The episode's backend: sub-agent calls go to `hf` as they are; a main-agent call is run on
    `hf` with its real context for as many tokens as its scripted turn has, then answered with the
    script's text (a random-weight model would not write tool calls)."""

    name = "forced-main"

    def __init__(self, hf: HFBackend, turns: list[str]) -> None:
        self.hf, self.turns = hf, list(turns)

    async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, req: GenerateRequest) -> Completion:
        if is_subagent(req):
            return (await self.hf.generate([req]))[0]
        text = self.turns.pop(0)
        n = max(len(self.hf.renderer.tok.encode(text)), 1)
        real = (await self.hf.generate([dataclasses.replace(req, max_new_tokens=n)]))[0]
        return Completion(text=text, finish_reason="stop", prompt_tokens=real.prompt_tokens,
                          visual_tokens=real.visual_tokens, completion_tokens=real.completion_tokens)


async def batch(hf: HFBackend, reader, mode: str, n: int, args) -> dict:
    """`n` episodes of `mode` at once; their wall time, and what the backend did meanwhile."""
    windows = crops(args.crops)
    cfg = EpisodeConfig(mode=mode, frames=args.frames, max_turns=len(windows) + 2 if mode == "sequential" else 3,
                        sub_max_new_tokens=args.sub_tokens, max_parallel=max(args.crops, 1))
    hf.batch_sizes.clear()
    for k in hf.timing:
        hf.timing[k] = 0
    t = time.perf_counter()
    eps = await asyncio.gather(*(run_episode(ForcedMain(hf, script(mode, windows)), reader,
                                             "Which colour was the shape?", cfg) for _ in range(n)))
    wall = time.perf_counter() - t
    calls = [ep.n_executed_calls for ep in eps]
    assert all(c == len(windows) for c in calls), (mode, calls)
    last = eps[0].turns[-1].generation
    return {"episodes": n, "wall_s": wall, "episodes_per_min": 60 * n / wall, "main_prompt_tokens": last.prompt_tokens,
            "prefills": list(hf.batch_sizes), "peak_rows": hf.peak_rows, **{k: v for k, v in hf.timing.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["tiny", "8b"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--decode", default="auto", help="the hf backend's decode path (see HFBackend)")
    ap.add_argument("--episodes", type=int, default=8, help="episodes run together")
    ap.add_argument("--frames", type=int, default=64, help="overview K")
    ap.add_argument("--crops", type=int, default=5)
    ap.add_argument("--sub-tokens", type=int, default=128, help="tokens each sub-agent generates")
    ap.add_argument("--modes", default="parallel,sequential")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, processor = build_model(args.arch, args.device)
    reader, frames_from = open_video(make_spec(5, min_len=300, max_len=300))
    hf = HFBackend(model, processor, max_batch=max(args.episodes * args.crops, 1), batch_wait_ms=5, decode=args.decode)
    hf.renderer.stop_ids = set()  # forced lengths: no early end token
    rows = {"arch": args.arch, "device": args.device, "decode": hf.decode, "frames": args.frames, "crops": args.crops,
            "sub_tokens": args.sub_tokens, "frames_from": frames_from, "modes": {}}

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))

    for mode in [m for m in args.modes.split(",") if m]:
        short = argparse.Namespace(**{**vars(args), "sub_tokens": 4})
        t = time.perf_counter()
        asyncio.run(batch(hf, reader, mode, args.episodes, short))  # warm-up: most graphs are captured here
        warm = time.perf_counter() - t
        rows["modes"][mode] = r = asyncio.run(batch(hf, reader, mode, args.episodes, args))
        r["warmup_s"] = warm
        print(f"{mode}: {args.episodes} episodes in {r['wall_s']:.2f} s, {r['episodes_per_min']:.1f} episodes/min "
              f"(prefill {r['prefill_s']:.2f} s, decode {r['decode_s']:.2f} s; warm-up {warm:.1f} s)", flush=True)
        save()
    modes = rows["modes"]
    if "parallel" in modes and "sequential" in modes:
        rows["sequential_over_parallel"] = modes["sequential"]["wall_s"] / modes["parallel"]["wall_s"]
    save()
    if getattr(hf._static, "failed", None):
        print(f"decode {hf.decode}: capturing failed, the steps ran eagerly: {hf._static.failed}")
    reader.close()


if __name__ == "__main__":
    main()
