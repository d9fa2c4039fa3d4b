"""Parallel vs sequential episodes, and the main context in parallel vs inline mode (issue 4 figures).

The main agent is scripted to request N = 1..5 crops of 10 s each (in one turn for parallel and
inline; one per turn for sequential). The sub-agents are the real tiny Qwen3-VL through the hf
backend (ScriptedBackend delegates them), so their batching is real: the N sub-agents of a
parallel turn run as one batched generate. Main turns cost no model time here (scripted), so the
sequential figure is a lower bound: a real main agent adds N extra turns of generation to it.
Main-context token counts come from the hf backend's own renderer (the exact ids it would feed).

    .venv/bin/python benchmarks/bench_episode.py [--sub-tokens 64] [--repeats 3] [--frames 16] [--json out.json]
    python benchmarks/bench_episode.py --arch 8b --device cuda --sub-tokens 256   # Qwen3-VL-8B's shape, random weights
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from rich.console import Console
from rich.table import Table

from paravt import protocol as P
from paravt.agent import EpisodeConfig, run_episode
from paravt.backends.hf import HFBackend
from paravt.backends.scripted import ScriptedBackend
from paravt.models.tiny import build_8b_random, build_tiny
from paravt.synth.render import make_spec, render_frame, write_video
from paravt.video import VideoReader
from paravt.video.frames import Frame
from paravt.video.sampling import overview_times, resize_to_budget, sample_times

THINK = "The event is short and falls between overview frames; I look closer.</think>\n"
ANSWER = "The summaries settle it.</think><answer>A</answer>"


class RenderedReader:
    """The reader's interface over frames rendered from the video's spec, for machines without PyAV
    (the GPU image): the episode's model work is the same, only the decoding is left out."""

    def __init__(self, spec) -> None:
        self.spec, self.path, self.duration = spec, Path("rendered.mp4"), spec.duration
        self.size = resize_to_budget(spec.size, spec.size)

    def _frames(self, times: list[float]) -> list[Frame]:
        from PIL import Image

        h, w = self.size
        return [Frame(np.asarray(Image.fromarray(render_frame(self.spec, t)).resize((w, h), Image.BILINEAR)), t, t)
                for t in times]

    async def aoverview(self, k: int) -> list[Frame]:
        return self._frames(overview_times(self.duration, k))

    async def acrop(self, start: float, end: float, fps: float = 1.0, max_frames: int = 16,
                    num_frames: int | None = None) -> list[Frame]:
        return self._frames(sample_times(start, end, fps, max_frames, num_frames, duration=self.duration,
                                         source_fps=self.spec.fps))

    def close(self) -> None:
        pass


def open_video(spec):
    """A real decoded video where PyAV is installed, else the rendered frames of the same spec."""
    try:
        import av  # noqa: F401
    except ImportError:
        return RenderedReader(spec), "rendered (no PyAV)"
    return VideoReader(write_video(spec, Path(tempfile.mkdtemp()) / "bench.mp4")), "decoded by PyAV"


def crops(n: int) -> list[tuple[float, float]]:
    """n windows of 10 s, 50 s apart."""
    return [(20.0 + 50 * i, 30.0 + 50 * i) for i in range(n)]


def script(mode: str, windows: list[tuple[float, float]]) -> list[str]:
    if mode == "sequential":
        return [THINK + P.format_tool_call(a, b) for a, b in windows] + [ANSWER]
    return [THINK + "\n".join(P.format_tool_call(a, b) for a, b in windows), ANSWER]


def episode(hf: HFBackend, reader: VideoReader, mode: str, windows, frames: int, sub_tokens: int):
    """One scripted episode on `hf` (one backend for the whole run: its CUDA graphs are kept)."""
    hf.batch_sizes.clear()

    def count(req):
        r = hf.renderer.render(req.messages, prefix=req.prefix)
        return len(r.ids), r.visual_tokens

    backend = ScriptedBackend(script(mode, windows), sub=hf, count_tokens=count)
    cfg = EpisodeConfig(mode=mode, frames=frames, max_turns=len(windows) + 2 if mode == "sequential" else 3,
                        sub_max_new_tokens=sub_tokens)
    ep = asyncio.run(run_episode(backend, reader, "Which colour was the shape?", cfg))
    assert ep.n_executed_calls == len(windows), (mode, ep.n_executed_calls)
    return ep, list(hf.batch_sizes)


def build_model(arch: str, device: str):
    """(model, processor): Qwen3-VL-8B's architecture with random weights in bf16, or the tiny one."""
    if arch == "8b":
        import torch

        return build_8b_random(device=device, dtype=torch.bfloat16)
    model, processor = build_tiny(seed=0)
    return model.to(device), processor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sub-tokens", type=int, default=64, help="tokens each sub-agent generates")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frames", type=int, default=16, help="overview K")
    ap.add_argument("--max-n", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--arch", choices=["tiny", "8b"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--decode", default="auto", help="the hf backend's decode path (see HFBackend)")
    ap.add_argument("--modes", default="parallel,sequential,inline", help="episode modes to time")
    args = ap.parse_args()
    modes = args.modes.split(",")
    model, processor = build_model(args.arch, args.device)
    reader, frames_from = open_video(make_spec(5, min_len=300, max_len=300))
    print(f"frames: {frames_from}", flush=True)
    hf = HFBackend(model, processor, batch_wait_ms=5, decode=args.decode)
    hf.renderer.stop_ids = set()  # every sub-agent generates exactly sub_tokens: no early end token
    for n in range(1, args.max_n + 1):  # warm-up: each batch size's graph is captured (or compiled) here
        episode(hf, reader, "parallel", crops(n), args.frames, 4)

    rows = []
    for n in range(1, args.max_n + 1):
        windows = crops(n)
        row: dict = {"n": n}
        for mode in modes:
            times = []
            for _ in range(args.repeats):
                ep, batches = episode(hf, reader, mode, windows, args.frames, args.sub_tokens)
                times.append(ep.wall_time)
            last = ep.turns[-1].generation
            row[mode] = {"wall_s": statistics.median(times), "main_prompt_tokens": last.prompt_tokens,
                         "main_visual_tokens": last.visual_tokens, "main_images": last.n_images,
                         "sub_batches": batches}
        rows.append(row)
    reader.close()

    table = Table(title=f"episode wall time (median of {args.repeats}) and the final main context; {args.arch} Qwen3-VL, "
                        f"{args.device}, decode {hf.decode}, K={args.frames}, 10 s crops, {args.sub_tokens} tokens "
                        "per sub-agent")
    for col in ("N", "parallel s", "sequential s", "seq/par", "par main tokens (visual)",
                "inline main tokens (visual)", "sub batches par", "sub batches seq"):
        table.add_column(col, justify="right")
    p1 = rows[0]["parallel"]["wall_s"]
    empty = {"wall_s": float("nan"), "main_prompt_tokens": "-", "main_visual_tokens": "-", "sub_batches": "-"}
    for r in rows:
        par, seq, inl = (r.get(m, empty) for m in ("parallel", "sequential", "inline"))
        table.add_row(str(r["n"]), f"{par['wall_s']:.2f} ({par['wall_s'] / p1:.2f}x)", f"{seq['wall_s']:.2f}",
                      f"{seq['wall_s'] / par['wall_s']:.2f}",
                      f"{par['main_prompt_tokens']} ({par['main_visual_tokens']})",
                      f"{inl['main_prompt_tokens']} ({inl['main_visual_tokens']})",
                      str(par["sub_batches"]), str(seq["sub_batches"]))
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if getattr(hf._static, "failed", None):
        print(f"decode {hf.decode}: capturing failed, the steps ran eagerly: {hf._static.failed}")


if __name__ == "__main__":
    main()
