"""`paravt demo`: the most end-to-end thing paravt can show on a laptop CPU, offline.

A fresh synthetic long video with a short event, its overview frames and a crop around the
event, a model turn parsed and scored with the PARA-GRPO rewards, then one full parallel
episode with the model (the shipped tiny checkpoint when present, else an untrained tiny
Qwen3-VL) and its timeline.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


DEMO_FRAMES = 4  # the event usually falls between 4 overview frames, so the agent crops


def demo(out_dir: str = "outputs/demo", seed: int | None = None, model: str | None = None,
         frames: int = DEMO_FRAMES) -> None:
    from paravt import protocol as P
    from paravt.agent import EpisodeConfig, run_episode
    from paravt.ask import live_printer, make_backend
    from paravt.rewards import score_episode
    from paravt.synth.dataset import MINI_TASK
    from paravt.synth.render import event_mask, make_spec, write_video
    from paravt.timeline import draw_timeline
    from paravt.video import VideoReader

    console = Console()
    t0 = time.perf_counter()
    seed = int(time.time()) % 100000 if seed is None else seed
    out = Path(out_dir)
    # the shipped tiny model's task (SynthVT-mini): 60-80 s videos, 1-2 short events
    spec = make_spec(seed, min_len=MINI_TASK["min_len"], max_len=MINI_TASK["max_len"], n_events=MINI_TASK["n_events"],
                     event_len=(MINI_TASK["event_min"], MINI_TASK["event_max"]))
    path = write_video(spec, out / f"synth_{seed}.mp4")
    reader = VideoReader(path)
    info = reader.probe()
    console.rule("[bold]1. a synthetic long video")
    console.print(f"{path}: {info.duration:.0f} s, {info.width}x{info.height} @ {info.fps:g} fps, seed {seed}")
    for e in spec.events:
        console.print(f"  event: {e.colour} {e.shape} at the {e.position}, {e.start:g}–{e.end:g} s")

    target = spec.events[0]
    overview = reader.overview(frames)
    seen = [f.timestamp for f in overview if target.start <= f.timestamp < target.end]
    console.rule(f"[bold]2. overview: K={frames} frames")
    console.print(" ".join(P.timestamp_text(f.timestamp) for f in overview))
    console.print(f"the {target.name} ({target.start:g}–{target.end:g} s) is "
                  + (f"[green]visible in {len(seen)} overview frame(s)[/green]" if seen
                     else "[yellow]between overview frames: the agent must crop[/yellow]"))
    crop = reader.crop(max(0.0, target.start - 2), target.end + 2)
    mask = event_mask(target, info.width)
    table = Table("frame time", "event pixels look like", title=f"crop {max(0, target.start - 2):g}–{target.end + 2:g} s at 1 fps")
    for f in crop:
        present = target.start <= f.timestamp < target.end
        rgb = tuple(int(v) for v in f.image[mask].mean(axis=0)) if f.image.shape[0] == info.height else "-"
        table.add_row(P.timestamp_text(f.timestamp), f"{rgb} {'← ' + target.name if present else ''}")
    console.print(table)

    console.rule("[bold]3. a model turn, parsed and scored")
    window = (max(0.0, target.start - 5), min(info.duration, target.end + 5))
    turn1 = ("The overview does not show the shape clearly, so I look at two windows at once.</think>\n"
             + P.format_tool_call(*window) + "\n" + P.format_tool_call(0, 30))
    turn2 = f"The helper saw a {target.colour} {target.shape} at {target.start:g} s.</think><answer>{target.colour}</answer>"
    parsed = P.parse(turn1, prefix=P.THINK_PREFIX)
    console.print("both turns are generated after a forced '<think>' prefix, which counts as present")
    console.print(f"turn 1: {len(parsed.calls)} parallel calls: "
                  + ", ".join(f"{P.crop_args(c).start:g}–{P.crop_args(c).end:g} s" for c in parsed.calls))
    r = score_episode([turn1, turn2], target.colour, target.colour, "oe", n_parsed_calls=2,
                      n_executed_calls=2, prefix=P.THINK_PREFIX)
    console.print(f"turn 2: answer {P.extract_answer(P.THINK_PREFIX + turn2)!r}")
    console.print(f"rewards: accuracy {r.accuracy:.2f}, format {r.format:.2f}, anchor {r.anchor:.2f}, "
                  f"tool {r.tool:.2f}, total {r.total:.2f}")

    console.rule("[bold]4. the parallel episode with a model")
    backend = make_backend(model, console=console)
    question = f"What colour was the {target.shape}? Answer with one word."  # a colour_oe question, as trained
    console.print(f"question: {question}  (truth: {target.colour})")
    cfg = EpisodeConfig(frames=frames, max_new_tokens=256, sub_max_new_tokens=96, max_turns=3)

    async def go():
        try:
            return await run_episode(backend, reader, question, cfg, question_type="oe", on_event=live_printer(console))
        finally:
            await backend.aclose()

    ep = asyncio.run(go())
    png = draw_timeline(ep, out / f"timeline_{seed}.png")
    got = (ep.answer or "").strip().lower()
    console.print(f"answer {ep.answer!r}, truth {target.colour!r}: "
                  + ("[green]right[/green]" if got == target.colour else "[red]wrong[/red]"))
    console.print(f"calls: {ep.n_parsed_calls} parsed, {ep.n_executed_calls} executed; "
                  f"main-context visual tokens {ep.main_visual_tokens}; timeline: {png}")
    console.print(f"[dim]demo finished in {time.perf_counter() - t0:.1f} s[/dim]")
