"""`paravt ask`: one episode, printed as it happens."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from paravt.agent import Episode, EpisodeConfig, run_episode

DEFAULT_MODEL = Path(__file__).parent / "assets" / "tiny-paravt"


def make_backend(model: str | None, *, api_key: str | None = None, console: Console | None = None):
    """A URL gives the OpenAI-compatible client; a path or hub id loads the model in-process."""
    console = console or Console(stderr=True)
    if model and model.startswith(("http://", "https://")):
        from paravt.backends.openai import OpenAIBackend

        return OpenAIBackend(model, api_key=api_key)
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    if model is None:
        if (DEFAULT_MODEL / "config.json").exists():
            model = str(DEFAULT_MODEL)
        else:
            from paravt.models.tiny import build_tiny

            console.print("[yellow]no model given and no shipped model found: using an untrained tiny Qwen3-VL "
                          "(its output is noise; pass --model)[/yellow]")
            m, p = build_tiny()
            return HFBackend(m, p)
    m, p = load_model(model)
    return HFBackend(m, p)


def live_printer(console: Console):
    def on_event(name: str, p: dict) -> None:
        if name == "overview":
            console.print(f"[dim]overview: {len(p['times'])} frames over {p['duration']:.1f} s[/dim]")
        elif name == "generated":
            if p.get("think"):
                console.print(Panel(p["think"], title=f"turn {p['turn'] + 1} · think", border_style="blue"))
            for prob in p.get("problems", []):
                console.print(f"[yellow]  parse problem: {prob}[/yellow]")
        elif name == "calls_dispatched" and p["calls"]:
            windows = ", ".join(f"{a.get('start_time', a.get('start', '?'))}–{a.get('end_time', a.get('end', '?'))} s"
                                for a in p["calls"])
            console.print(f"[cyan]→ dispatching {len(p['calls'])} crop(s) in parallel: {windows}[/cyan]")
        elif name == "subcall_finished":
            style = "green" if p["status"] == "ok" else "red"
            span = f"{p['start']:.1f}–{p['end']:.1f} s" if p["start"] is not None else "?"
            console.print(f"  [{style}]sub-agent {p['index'] + 1} ({span}):[/{style}] {p['response'][:300]}")
        elif name == "answer":
            console.print(Panel(str(p["answer"]), title=f"answer ({p['wall_time']:.1f} s)", border_style="green"))

    return on_event


def ask(video: str, question: str, *, model: str | None, config: EpisodeConfig, question_type: str,
        json_path: str | None, timeline_path: str | None, api_key: str | None = None,
        console: Console | None = None) -> Episode:
    console = console or Console()
    backend = make_backend(model, api_key=api_key, console=console)

    async def go() -> Episode:
        try:
            return await run_episode(backend, video, question, config, question_type=question_type,
                                     on_event=live_printer(console))
        finally:
            await backend.aclose()

    with console.status("running episode…"):
        ep = asyncio.run(go())
    if json_path:
        Path(json_path).write_text(json.dumps(ep.to_dict(), indent=1))
        console.print(f"[dim]trace written to {json_path}[/dim]")
    if timeline_path:
        from paravt.timeline import draw_timeline

        draw_timeline(ep, timeline_path)
        console.print(f"[dim]timeline written to {timeline_path}[/dim]")
    return ep
